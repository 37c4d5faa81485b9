// braid — Work: the handle a collective returns immediately.
#pragma once

#include <braid/export.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>

namespace braid {

namespace detail {
struct WorkState;
}

/// Handle to one posted collective.
///
/// A Work completes when this rank's part of the collective is done: its output
/// buffer holds the result and its input buffer may be reused. Until then the
/// caller must keep both buffers alive and unmodified.
///
/// Thread safety: all methods may be called from any thread, concurrently.
/// Lifetime: copies share state; dropping every copy does not cancel the
/// collective (the communicator keeps running it), it only forgets the result.
class BRAID_API Work {
 public:
  /// An empty handle; wait() returns true at once and test() is true.
  Work() noexcept;
  /// Drops this handle (never cancels the collective).
  ~Work();
  /// Copies share the same state.
  Work(const Work&) noexcept;
  /// Copies share the same state.
  Work& operator=(const Work&) noexcept;
  /// Moves the handle.
  Work(Work&&) noexcept;
  /// Moves the handle.
  Work& operator=(Work&&) noexcept;

  /// Blocks until the collective completes. Rethrows its braid::Error if it failed.
  void wait() const;

  /// Blocks for at most `timeout`; returns false if still running then (the
  /// collective keeps going; only the communicator's deadline fails it). Rethrows
  /// its braid::Error if it failed.
  bool wait(std::chrono::milliseconds timeout) const;

  /// Non-blocking: true once completed, successfully or not. Never throws.
  bool test() const noexcept;

  /// The failure, once completed unsuccessfully; nullptr otherwise.
  std::exception_ptr exception() const noexcept;

  /// Calls `callback` once when the collective completes, with its failure (nullptr on
  /// success), like c10d's Future::then. It runs on the thread that completes the work:
  /// the communicator's progress thread, or a thread driving progress while it waits
  /// (small collectives run on the caller's thread), or, if the work is already done, at
  /// once on this thread before on_complete returns. Callbacks added before completion run
  /// in the order they were added. A callback may post new collectives, but must not wait
  /// for any Work (it would block the progress thread) and should return quickly; an
  /// exception it throws is logged and dropped. On an empty Work it runs at once.
  /// Thread-safe.
  void on_complete(std::function<void(std::exception_ptr error)> callback) const;

  /// Internal: wraps a state created by the engine.
  explicit Work(std::shared_ptr<detail::WorkState> state) noexcept;

 private:
  std::shared_ptr<detail::WorkState> state_;
};

}  // namespace braid
