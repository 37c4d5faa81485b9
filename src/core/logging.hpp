// braid logging: one line per message to stderr, prefixed with the rank, gated by
// BRAID_DEBUG (error, warn, info, trace). Cheap when disabled: the message is not
// formatted unless its level is on.
#pragma once

#include "core/config.hpp"

#include <sstream>
#include <string>

namespace braid::core {

/// True when messages at `level` are printed.
bool log_enabled(LogLevel level) noexcept;
/// Prints one line at `level` (thread-safe; lines never interleave).
void log_line(LogLevel level, const std::string& message) noexcept;
/// Sets the rank shown in the prefix of this thread's messages (-1 = none).
void set_log_rank(int rank) noexcept;

}  // namespace braid::core

/// BRAID_LOG(info, "connected to " << peer);
#define BRAID_LOG(level, stream_expr)                                          \
  do {                                                                         \
    if (::braid::core::log_enabled(::braid::core::LogLevel::level)) {          \
      std::ostringstream braid_log_os_;                                        \
      braid_log_os_ << stream_expr;                                            \
      ::braid::core::log_line(::braid::core::LogLevel::level, braid_log_os_.str()); \
    }                                                                          \
  } while (0)
