# Warnings and sanitizers applied to every braid target.
add_library(braid_build_flags INTERFACE)
target_compile_options(braid_build_flags INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wno-missing-field-initializers)
if(BRAID_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "BRAID_FUZZ=ON needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++ "
                        "(scripts/fuzz.sh does; scripts/setup.sh installs clang)")
  endif()
  # Fuzzing without sanitizers would miss the bugs that do not crash at once.
  if(NOT BRAID_SANITIZE)
    set(BRAID_SANITIZE address,undefined)
  endif()
  # Coverage feedback from every braid object; the targets link libFuzzer itself.
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
endif()
if(BRAID_SANITIZE)
  # C++ only: nvcc must not see the sanitizer flags (CUDA sources get none).
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${BRAID_SANITIZE}>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=all>)
  add_link_options(-fsanitize=${BRAID_SANITIZE})
endif()
