// How braidrun's rank programs (launcher_helper, launcher_store_helper) read a
// variable: straight from `environ`, since braid's house rule keeps getenv in
// src/core/config.cpp (tests/layering.sh).
#pragma once

#include <cstring>
#include <string>

extern "C" char** environ;  // as <unistd.h> declares it

namespace launcher_test {

/// The value of `name` in the environment; "" when it is not set.
inline std::string env(const char* name) {
  const std::size_t len = std::strlen(name);
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, name, len) == 0 && (*e)[len] == '=') return *e + len + 1;
  return "";
}

}  // namespace launcher_test
