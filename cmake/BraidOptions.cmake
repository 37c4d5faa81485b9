# Warnings and sanitizers applied to every braid target.
add_library(braid_build_flags INTERFACE)
target_compile_options(braid_build_flags INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wno-missing-field-initializers)
if(BRAID_SANITIZE)
  add_compile_options(-fsanitize=${BRAID_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${BRAID_SANITIZE})
endif()
