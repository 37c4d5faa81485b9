// braid logging: one line per message to stderr, prefixed with the rank, gated by a
// level (BRAID_DEBUG: error, warn, info, trace). Cheap when disabled: the message is not
// formatted unless its level is on.
//
// base knows no configuration: the level comes from a source that the layer owning the
// configuration registers (core/config.cpp registers one that parses BRAID_DEBUG), asked
// once, at the first message; until a source is registered the level is warn.
#pragma once

#include <sstream>
#include <string>

namespace braid::base {

/// Log verbosity, most severe first.
enum class LogLevel { error = 0, warn, info, trace };

/// Registers where the level comes from (called once, at the first log_enabled()).
/// Call before the first message; later calls have no effect once the level is read.
void set_log_level_source(LogLevel (*source)() noexcept) noexcept;
/// True when messages at `level` are printed.
bool log_enabled(LogLevel level) noexcept;
/// Prints one line at `level` (thread-safe; lines never interleave).
void log_line(LogLevel level, const std::string& message) noexcept;
/// Sets the rank shown in the prefix of this thread's messages (-1 = none).
void set_log_rank(int rank) noexcept;

}  // namespace braid::base

/// BRAID_LOG(info, "connected to " << peer);
#define BRAID_LOG(level, stream_expr)                                          \
  do {                                                                         \
    if (::braid::base::log_enabled(::braid::base::LogLevel::level)) {          \
      std::ostringstream braid_log_os_;                                        \
      braid_log_os_ << stream_expr;                                            \
      ::braid::base::log_line(::braid::base::LogLevel::level, braid_log_os_.str()); \
    }                                                                          \
  } while (0)
