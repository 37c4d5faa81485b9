# Installs the build tree into a scratch prefix, then configures, builds and runs the
# consumer project in tests/package/consumer against it with find_package(braid).
foreach(v BRAID_SOURCE_DIR BRAID_BINARY_DIR WORK_DIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "${v} not set")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/install)
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BRAID_BINARY_DIR} --prefix ${prefix}
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "install failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${BRAID_SOURCE_DIR}/tests/package/consumer -B ${WORK_DIR}/build
                        -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer failed: ${rc}")
endif()
foreach(program consumer nccl_consumer)
  execute_process(COMMAND ${WORK_DIR}/build/${program} RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "the consumer ${program} failed: ${rc}")
  endif()
endforeach()

# The installed tools run from the prefix with no LD_LIBRARY_PATH: braid_info, and
# braidrun starting two ranks of the installed allreduce_bench (a real 2-rank job).
foreach(tool braid_info braidrun allreduce_bench)
  if(NOT EXISTS ${prefix}/bin/${tool})
    message(FATAL_ERROR "${prefix}/bin/${tool} was not installed")
  endif()
endforeach()
execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ${prefix}/bin/braid_info
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc)
  message(FATAL_ERROR "installed braid_info failed (${rc}): ${out}${err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH
                        ${prefix}/bin/braidrun -n 2 --timeout 120 -- ${prefix}/bin/allreduce_bench
                        -b 1K -e 64K -f 8 -n 2 -w 1 -c 1
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc)
  message(FATAL_ERROR "installed braidrun + allreduce_bench failed (${rc}): ${out}${err}")
endif()
message(STATUS "installed tools ran from ${prefix}:\n${out}")
