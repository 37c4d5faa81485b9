// braid's one event loop primitive: an epoll set plus an eventfd to wake it.
//
// Transports register their file descriptors here so that the engine's progress thread
// can sleep in one epoll_wait when nothing is moving, and user threads wake it with
// wake() when they post work; the TCP store server runs its thread on one too. Not
// thread-safe except wake().
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

namespace braid::base {

class Poller {
 public:
  /// Called on the progress thread with the epoll event mask that fired.
  using Handler = std::function<void(std::uint32_t events)>;

  /// Creates the epoll set and the wake-up eventfd. Throws braid::Error(System).
  Poller();
  ~Poller();
  Poller(const Poller&) = delete;
  Poller& operator=(const Poller&) = delete;

  /// Watches `fd` for `events` (EPOLLIN/EPOLLOUT/...); replaces an existing entry.
  void watch(int fd, std::uint32_t events, Handler handler);
  /// Stops watching `fd` (before closing it).
  void unwatch(int fd);
  /// Blocks for up to `timeout_ms` (-1 = forever) until an fd is ready or wake()
  /// is called; runs the handlers of ready fds (collect() then dispatch()). Returns
  /// the number of events handled (a wake-up counts as one).
  int wait(int timeout_ms);
  /// Blocks like wait() but only stores the ready events for dispatch(); runs no
  /// handler. Returns the number of events fetched (a wake-up counts as one).
  int collect(int timeout_ms);
  /// Runs the handlers of the events stored by collect() (skipping fds unwatched
  /// since). Returns the number of handlers run.
  int dispatch();
  /// Wakes a thread blocked in wait(). Thread-safe and async-signal-safe.
  void wake() noexcept;
  /// Wakes a thread blocked in wait() or collect() at `when`, or at a later time that
  /// another call asks for before then (the latest asked wins; a thread woken earlier by
  /// anything else is not woken again for it). Thread-safe; a system call (5 us in a VM)
  /// only when no such wake-up is pending, so it may be called on every small operation.
  void wake_at(std::chrono::steady_clock::time_point when) noexcept;

  struct Impl;

 private:
  int collect_counting(int timeout_ms, int* wakes);
  /// Clears wake_at()'s timer after it fired; true (and armed again) when a later time
  /// has been asked for since.
  bool timer_fired_early() noexcept;
  std::unique_ptr<Impl> impl_;
};

/// Arms timerfd `fd` (CLOCK_MONOTONIC, which steady_clock is on Linux) to fire at `when`,
/// or disarms it when `when` is time_point::max(). A time already past fires at once.
void arm_timerfd(int fd, std::chrono::steady_clock::time_point when) noexcept;

}  // namespace braid::base
