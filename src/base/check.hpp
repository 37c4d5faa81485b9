// braid's one condition-check macro: throws braid::Error(code) with a streamed
// message when `cond` is false.
#pragma once

#include <braid/error.hpp>

#include <sstream>

/// BRAID_CHECK(count <= max, InvalidUsage, "count " << count << " exceeds ...");
#define BRAID_CHECK(cond, code, stream_expr)                                   \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::ostringstream braid_check_os_;                                      \
      braid_check_os_ << stream_expr;                                          \
      throw ::braid::Error(::braid::ErrorCode::code, braid_check_os_.str());  \
    }                                                                          \
  } while (0)
