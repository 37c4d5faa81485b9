// braid Poller: one epoll set plus an eventfd that wake() writes to.
//
// Handlers are kept in a table indexed by fd. Each watch() of a new fd gets a fresh
// generation number, which travels in the epoll event's data next to the fd, so an
// event that was already fetched in a batch for an fd that a handler has since
// unwatched (or unwatched, closed, reopened under the same number and watched
// again) is recognised as stale and dropped. A handler is held by shared_ptr and
// the running copy is kept alive for the call, so a handler may unwatch or re-watch
// its own fd.
//
// collect() (epoll_wait) and dispatch() (handlers) are separate so that a thread can
// sleep in collect() without holding the lock that guards the transports, while
// another thread that holds it runs dispatch(): events fetched by one are run by
// whichever thread dispatches next, so none is lost with edge-triggered fds.
#include "base/poller.hpp"

#include "base/text.hpp"

#include <braid/error.hpp>

#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace braid::base {

namespace {

constexpr std::uint64_t kWakeKey = ~std::uint64_t{0};
constexpr std::uint64_t kTimerKey = ~std::uint64_t{0} - 1;  // wake_at()'s timerfd
constexpr int kMaxEvents = 64;

std::string fd_error(const char* what, int fd, int err) {
  return std::string(what) + " (fd " + std::to_string(fd) + "): " + errno_text(err);
}

}  // namespace

struct Poller::Impl {
  struct Entry {
    bool active = false;
    std::uint32_t generation = 0;
    std::shared_ptr<Handler> handler;
  };

  int epfd = -1;
  int wakefd = -1;
  int timerfd = -1;                      // wake_at()'s
  std::atomic<bool> timer_armed{false};    // timerfd is armed (at wake_ns or earlier)
  std::atomic<long long> wake_ns{0};       // the time last asked for (steady clock)
  std::uint32_t next_generation = 1;
  std::vector<Entry> entries;  // indexed by fd
  std::mutex pending_mu;                // guards `pending` only
  std::vector<epoll_event> pending;     // fetched by collect(), not yet dispatched
  // pending is not empty (set under pending_mu): dispatch() runs on every pass of the
  // engine, and most passes find nothing, so they read this instead of taking the lock.
  std::atomic<bool> has_pending{false};
  std::vector<epoll_event> batch;       // dispatch()'s working copy
};

Poller::Poller() : impl_(std::make_unique<Impl>()) {
  impl_->epfd = ::epoll_create1(EPOLL_CLOEXEC);
  if (impl_->epfd < 0) {
    throw Error(ErrorCode::System, std::string("epoll_create1: ") + errno_text(errno));
  }
  impl_->wakefd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl_->wakefd < 0) {
    int err = errno;
    ::close(impl_->epfd);
    throw Error(ErrorCode::System, std::string("eventfd: ") + errno_text(err));
  }
  impl_->timerfd = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  const auto fail = [&](const std::string& message) {  // message made first: it reads errno
    if (impl_->timerfd >= 0) ::close(impl_->timerfd);
    ::close(impl_->wakefd);
    ::close(impl_->epfd);
    throw Error(ErrorCode::System, message);
  };
  if (impl_->timerfd < 0) fail(std::string("timerfd_create: ") + errno_text(errno));
  for (const auto& [fd, key] : {std::pair{impl_->wakefd, kWakeKey}, std::pair{impl_->timerfd, kTimerKey}}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = key;
    if (::epoll_ctl(impl_->epfd, EPOLL_CTL_ADD, fd, &ev) != 0)
      fail(fd_error("epoll_ctl(ADD) of the poller's own eventfd/timerfd", fd, errno));
  }
}

Poller::~Poller() {
  if (impl_->timerfd >= 0) ::close(impl_->timerfd);
  if (impl_->wakefd >= 0) ::close(impl_->wakefd);
  if (impl_->epfd >= 0) ::close(impl_->epfd);
}

void Poller::watch(int fd, std::uint32_t events, Handler handler) {
  if (fd < 0 || !handler) {
    throw Error(ErrorCode::InvalidUsage,
                "Poller::watch needs a valid fd and handler (fd " + std::to_string(fd) + ")");
  }
  auto& entries = impl_->entries;
  if (static_cast<std::size_t>(fd) >= entries.size()) entries.resize(static_cast<std::size_t>(fd) + 1);
  Impl::Entry& e = entries[static_cast<std::size_t>(fd)];
  const bool existing = e.active;
  const std::uint32_t generation = existing ? e.generation : impl_->next_generation;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = (std::uint64_t{generation} << 32) | static_cast<std::uint32_t>(fd);
  if (::epoll_ctl(impl_->epfd, existing ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev) != 0) {
    throw Error(ErrorCode::System,
                fd_error(existing ? "epoll_ctl(MOD)" : "epoll_ctl(ADD)", fd, errno));
  }
  if (!existing) {
    ++impl_->next_generation;
    if (impl_->next_generation == 0) impl_->next_generation = 1;
  }
  e.active = true;
  e.generation = generation;
  e.handler = std::make_shared<Handler>(std::move(handler));
}

void Poller::unwatch(int fd) {
  auto& entries = impl_->entries;
  if (fd < 0 || static_cast<std::size_t>(fd) >= entries.size()) return;
  Impl::Entry& e = entries[static_cast<std::size_t>(fd)];
  if (!e.active) return;
  // ENOENT/EBADF only mean the kernel already forgot the fd; nothing to undo.
  ::epoll_ctl(impl_->epfd, EPOLL_CTL_DEL, fd, nullptr);
  e.active = false;
  e.handler.reset();  // a running handler keeps its own reference
}

int Poller::collect(int timeout_ms) { return collect_counting(timeout_ms, nullptr); }

bool Poller::timer_fired_early() noexcept {
  std::uint64_t value;
  while (::read(impl_->timerfd, &value, sizeof value) > 0) {
  }
  impl_->timer_armed.store(false, std::memory_order_release);
  const auto at = impl_->wake_ns.load(std::memory_order_acquire);
  if (at <= std::chrono::steady_clock::now().time_since_epoch().count()) return false;
  // A later time was asked for since the timer was armed: sleep on until then.
  if (!impl_->timer_armed.exchange(true, std::memory_order_acq_rel))
    arm_timerfd(impl_->timerfd, std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(at)));
  return true;
}

int Poller::collect_counting(int timeout_ms, int* wakes) {
  epoll_event events[kMaxEvents];
  const auto start = std::chrono::steady_clock::now();
  const int total_ms = timeout_ms;
  for (;;) {
    const int n = ::epoll_wait(impl_->epfd, events, kMaxEvents, timeout_ms);
    if (n < 0) {
      if (errno == EINTR) return 0;
      throw Error(ErrorCode::System, std::string("epoll_wait: ") + errno_text(errno));
    }
    int fetched = 0;
    bool early_timer_alone = n > 0;  // wake_at()'s timer before the time last asked for, and nothing else
    {
      std::lock_guard<std::mutex> lock(impl_->pending_mu);
      for (int i = 0; i < n; ++i) {
        ++fetched;
        if (events[i].data.u64 == kTimerKey) {
          if (timer_fired_early()) continue;  // armed again for the later time
          early_timer_alone = false;
          if (wakes) ++*wakes;
          continue;
        }
        early_timer_alone = false;
        if (events[i].data.u64 == kWakeKey) {
          std::uint64_t value;
          while (::read(impl_->wakefd, &value, sizeof value) > 0) {
          }
          if (wakes) ++*wakes;
          continue;
        }
        impl_->pending.push_back(events[i]);
      }
      if (!impl_->pending.empty()) impl_->has_pending.store(true, std::memory_order_release);
    }
    if (!early_timer_alone) return fetched;
    // Not a wake-up: wait on for what is left of the timeout.
    if (total_ms == 0) return 0;
    if (total_ms > 0) {
      const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
      if (spent.count() >= total_ms) return 0;
      timeout_ms = total_ms - static_cast<int>(spent.count());
    }
  }
}

int Poller::dispatch() {
  if (!impl_->has_pending.load(std::memory_order_acquire)) return 0;
  {
    std::lock_guard<std::mutex> lock(impl_->pending_mu);
    impl_->has_pending.store(false, std::memory_order_relaxed);
    if (impl_->pending.empty()) return 0;
    impl_->batch.swap(impl_->pending);
  }
  int handled = 0;
  std::exception_ptr first_error;
  for (const epoll_event& ev : impl_->batch) {
    const auto fd = static_cast<std::size_t>(ev.data.u64 & 0xffffffffu);
    const auto generation = static_cast<std::uint32_t>(ev.data.u64 >> 32);
    if (fd >= impl_->entries.size()) continue;
    Impl::Entry& e = impl_->entries[fd];
    if (!e.active || e.generation != generation) continue;  // unwatched since it was fetched
    std::shared_ptr<Handler> handler = e.handler;
    ++handled;
    // Run the whole batch even if a handler throws: with edge-triggered fds an event
    // that is dropped here would not be reported again.
    try {
      (*handler)(ev.events);
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  impl_->batch.clear();
  if (first_error) std::rethrow_exception(first_error);
  return handled;
}

int Poller::wait(int timeout_ms) {
  int wakes = 0;
  collect_counting(timeout_ms, &wakes);
  return wakes + dispatch();
}

void Poller::wake() noexcept {
  const std::uint64_t one = 1;
  // EAGAIN means the counter is saturated, i.e. a wake-up is already pending.
  ssize_t r = ::write(impl_->wakefd, &one, sizeof one);
  (void)r;
}

void Poller::wake_at(std::chrono::steady_clock::time_point when) noexcept {
  impl_->wake_ns.store(when.time_since_epoch().count(), std::memory_order_release);
  if (!impl_->timer_armed.exchange(true, std::memory_order_acq_rel)) arm_timerfd(impl_->timerfd, when);
}

void arm_timerfd(int fd, std::chrono::steady_clock::time_point when) noexcept {
  itimerspec spec{};
  if (when != std::chrono::steady_clock::time_point::max()) {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(when.time_since_epoch()).count();
    spec.it_value.tv_sec = static_cast<time_t>(ns / 1000000000);
    spec.it_value.tv_nsec = static_cast<long>(ns % 1000000000);
    if (spec.it_value.tv_sec == 0 && spec.it_value.tv_nsec == 0) spec.it_value.tv_nsec = 1;  // 0 would disarm
  }
  ::timerfd_settime(fd, TFD_TIMER_ABSTIME, &spec, nullptr);
}

}  // namespace braid::base
