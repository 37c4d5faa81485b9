// Rank-prefixed, line-atomic logging to stderr.
#include "base/logging.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>

namespace braid::base {

namespace {
thread_local int t_rank = -1;
const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::error: return "ERROR";
    case LogLevel::warn: return "WARN";
    case LogLevel::info: return "INFO";
    case LogLevel::trace: return "TRACE";
  }
  return "?";
}
std::atomic<LogLevel (*)() noexcept> g_source{nullptr};
}  // namespace

void set_log_level_source(LogLevel (*source)() noexcept) noexcept { g_source.store(source); }

bool log_enabled(LogLevel level) noexcept {
  static const LogLevel configured = [] {
    auto* source = g_source.load();
    return source != nullptr ? source() : LogLevel::warn;
  }();
  return level <= configured;
}

void log_line(LogLevel level, const std::string& message) noexcept {
  char prefix[128];
  // TRACE lines carry a steady-clock time in ms (same clock on every process of a host),
  // so the lines of several ranks can be merged into one timeline.
  char when[32] = "";
  if (level == LogLevel::trace) {
    const auto us =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch());
    std::snprintf(when, sizeof when, "%.3f ", static_cast<double>(us.count()) / 1000.0);
  }
  if (t_rank >= 0)
    std::snprintf(prefix, sizeof prefix, "braid %s %s[pid %d rank %d] ", level_name(level), when,
                  static_cast<int>(getpid()), t_rank);
  else
    std::snprintf(prefix, sizeof prefix, "braid %s %s[pid %d] ", level_name(level), when,
                  static_cast<int>(getpid()));
  std::string line = prefix + message + "\n";
  // One write(2) per line so lines from several threads or processes never interleave.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

void set_log_rank(int rank) noexcept { t_rank = rank; }

}  // namespace braid::base
