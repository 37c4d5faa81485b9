# Warnings and sanitizers applied to every braid target.
add_library(braid_build_flags INTERFACE)
target_compile_options(braid_build_flags INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wno-missing-field-initializers)
if(BRAID_SANITIZE)
  # C++ only: nvcc must not see the sanitizer flags (CUDA sources get none).
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${BRAID_SANITIZE}>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=all>)
  add_link_options(-fsanitize=${BRAID_SANITIZE})
endif()
