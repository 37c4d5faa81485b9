#include "transport/skeleton.hpp"

#include <braid/error.hpp>

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <string>
#include <utility>

namespace braid::transport {

namespace {

/// Accepted sockets that have not finished their hello. Beyond, the listener stops
/// accepting until one finishes or passes its deadline: later connections wait in the
/// kernel's backlog, so none is evicted or refused (a real peer's hello may be queued).
constexpr std::size_t kMaxPendingAccepts = 64;

}  // namespace

void Connection::send_device(const void*, std::size_t, std::uint64_t, Request*) {
  throw Error(ErrorCode::Internal, "send_device on a connection to rank " + std::to_string(peer()) +
                                       " that does not take device memory (takes_device_memory() is false)");
}

void Connection::recv_device(void*, std::size_t, std::uint64_t, Request*) {
  throw Error(ErrorCode::Internal, "recv_device on a connection to rank " + std::to_string(peer()) +
                                       " that does not take device memory (takes_device_memory() is false)");
}

Skeleton::Skeleton(const CommonOptions& common, Poller& poller, PeerDirectory& directory, const char* name,
                   HelloFormat hello)
    : common_(common), poller_(poller), directory_(directory), name_(name), hello_(hello) {}

Skeleton::~Skeleton() { shutdown_skeleton(); }

std::string Skeleton::self() const {
  return std::string(name_) + " transport (rank " + std::to_string(common_.rank) + ")";
}

void Skeleton::serve(base::UniqueFd listen_fd) {
  timer_fd_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (!timer_fd_) throw Error(ErrorCode::System, self() + ": timerfd_create: " + errno_text(errno));
  listen_fd_ = std::move(listen_fd);
  poller_.watch(listen_fd_.get(), EPOLLIN | EPOLLET, [this](std::uint32_t) { listen_ready_ = true; });
  poller_.watch(timer_fd_.get(), EPOLLIN, [this](std::uint32_t) {
    std::uint64_t expirations;
    while (::read(timer_fd_.get(), &expirations, sizeof expirations) > 0) {
    }
    timer_fired_ = true;
  });
}

void Skeleton::shutdown_skeleton() noexcept {
  while (!pending_.empty()) drop_pending(pending_.size() - 1);
  for (base::UniqueFd* fd : {&listen_fd_, &timer_fd_}) {
    if (*fd) {
      poller_.unwatch(fd->get());
      fd->reset();
    }
  }
}

void Skeleton::check_peer(int peer) const {
  if (peer < 0 || peer >= common_.size || peer == common_.rank) {
    throw Error(ErrorCode::InvalidUsage, std::string(name_) + " transport: no connection from rank " +
                                             std::to_string(common_.rank) + " to rank " + std::to_string(peer) +
                                             " (world size " + std::to_string(common_.size) + ")");
  }
}

std::optional<std::string> PeerLookup::look(PeerDirectory& directory, int peer, const char* key, const char* what,
                                             const char* hint, std::chrono::milliseconds timeout, std::string* error) {
  const auto now = Clock::now();
  error->clear();
  std::optional<std::string> found;
  try {
    found = directory.try_lookup(peer, key);
  } catch (const std::exception& e) {
    *error = std::string("looking up ") + what + " failed: " + e.what();
    return std::nullopt;
  }
  if (found) return found;
  if (now >= deadline) {
    *error = std::string("it did not publish ") + what + " within " + std::to_string(timeout.count()) + " ms (" +
             hint + ")";
  } else {
    later(now);
  }
  return std::nullopt;
}

std::optional<std::string> Skeleton::look_up(PeerLookup& l, bool first, int peer, const char* key,
                                             const char* what, const char* hint, std::string* error) {
  if (first) l = PeerLookup{Clock::now() + common_.connect_timeout};
  auto found = l.look(directory_, peer, key, what, hint, common_.connect_timeout, error);
  if (!found && error->empty()) deadlines_dirty_ = true;  // a retry is scheduled
  return found;
}

bool hello_authentic(const HelloClaim& c, std::uint64_t comm_id, int rank, const std::string& token) {
  // The proof is checked whatever the claims say, so that its time says nothing.
  const bool proven =
      c.fixed != nullptr &&
      base::auth::verify(token, std::string(reinterpret_cast<const char*>(c.fixed), c.fixed_bytes), c.proof,
                         c.proof_bytes);
  return proven && c.comm_id == comm_id && c.to_rank == rank && c.from_rank >= 0 && c.from_rank < rank;
}

bool Skeleton::authentic(const HelloClaim& c) {
  // Anything that is not an authenticated peer of this communicator is closed without a
  // word: it must not be able to disturb the real connections. A recorded authentic hello
  // sent again is refused too: its nonce was used.
  return !closed_ && hello_authentic(c, common_.comm_id, common_.rank, common_.auth_token) &&
         replays_.first_use(c.proof);
}

bool Skeleton::progress() {
  if (closed_) return false;
  changed_ = false;
  bool moved = false;
  if (timer_fired_ || deadlines_dirty_) service_deadlines();
  if (listen_ready_) accept_all();
  if (!pending_.empty()) moved |= service_hellos();
  moved |= progress_connections();
  // A set-up step above may have scheduled a retry or a deadline: arm the timer now, so
  // that the caller may block right after this call.
  if (deadlines_dirty_) service_deadlines();
  return moved || changed_;
}

bool Skeleton::setup_waiting() const noexcept {
  // A listener held back by a full pending list waits for a hello or a deadline, not a spin.
  if (deadlines_dirty_ || timer_fired_ || (listen_ready_ && pending_.size() < kMaxPendingAccepts)) return true;
  for (const auto& p : pending_)
    if (p->readable) return true;
  return false;
}

void Skeleton::close_all(const std::string& reason) {
  if (closed_) return;
  closed_ = true;
  closed_reason_ = reason;
  fail_connections(reason);
  shutdown_skeleton();
  after_close();
}

// ---------------------------------------------------------------------------
// Accepting (the higher rank of a pair).

void Skeleton::accept_all() {
  listen_ready_ = false;
  for (;;) {
    if (pending_.size() >= kMaxPendingAccepts) {
      listen_ready_ = true;  // edge-triggered: come back once a pending hello is done
      return;
    }
    const int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      break;  // EAGAIN: drained. EMFILE and friends: try again on the next connection.
    }
    on_accept(fd);
    auto pa = std::make_unique<PendingAccept>();
    pa->fd.reset(fd);
    pa->deadline = Clock::now() + std::max(common_.connect_timeout, std::chrono::milliseconds(1000));
    pa->buf.resize(hello_.fixed_bytes);
    PendingAccept* raw = pa.get();
    pending_.push_back(std::move(pa));
    poller_.watch(fd, EPOLLIN | EPOLLRDHUP | EPOLLET, [raw](std::uint32_t) { raw->readable = true; });
    deadlines_dirty_ = true;
  }
}

void Skeleton::drop_pending(std::size_t i) noexcept {
  PendingAccept& pa = *pending_[i];
  if (pa.fd) poller_.unwatch(pa.fd.get());
  pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
}

long hello_needs(const HelloFormat& f, const unsigned char* buf, std::size_t got) {
  // The magic first, so that a stranger (a port scanner, an HTTP probe) is refused after
  // 4 bytes rather than waited for.
  if (got < 4) return 4;
  if (le::get(buf, 4) != f.magic) return -1;
  if (got < f.fixed_bytes) return static_cast<long>(f.fixed_bytes);
  const long tail = f.tail_bytes(buf);
  if (tail < 0) return -1;
  return static_cast<long>(f.fixed_bytes) + tail;
}

int Skeleton::read_hello(PendingAccept& pa) {
  for (;;) {
    const long need = hello_needs(hello_, pa.buf.data(), pa.got);
    if (need < 0) return -1;
    if (pa.got == static_cast<std::size_t>(need)) return 1;
    // buf holds the fixed part from the start; it grows to take the tail.
    if (pa.buf.size() < static_cast<std::size_t>(need)) pa.buf.resize(static_cast<std::size_t>(need));
    int err = 0;
    const int r = read_with_fd(pa.fd.get(), pa.buf.data(), &pa.got, static_cast<std::size_t>(need), &pa.passed, &err);
    if (r < 0) return -1;
    if (r == 0) {
      pa.readable = false;
      return 0;
    }
  }
}

bool Skeleton::service_hellos() {
  bool moved = false;
  for (std::size_t i = 0; i < pending_.size();) {
    PendingAccept& pa = *pending_[i];
    if (!pa.readable) {
      ++i;
      continue;
    }
    const int verdict = read_hello(pa);
    if (verdict == 0) {
      ++i;
      continue;
    }
    moved = true;
    // adopt() may replace the socket's handler (it keeps the fd): unwatch only what is left.
    const bool adopted = verdict > 0 && adopt(pa);
    if (!adopted && common_.on_refused) common_.on_refused(refusal(pa, verdict > 0));
    drop_pending(i);
  }
  return moved;
}

// ---------------------------------------------------------------------------
// Deadlines: the transport's (connect retries, answers that never come), then hellos
// that never come.

void Skeleton::service_deadlines() {
  timer_fired_ = false;
  deadlines_dirty_ = false;
  const auto now = Clock::now();
  auto next = connection_deadlines(now);
  for (std::size_t i = 0; i < pending_.size();) {
    if (now >= pending_[i]->deadline) {
      drop_pending(i);
    } else {
      next = std::min(next, pending_[i]->deadline);
      ++i;
    }
  }
  arm_timer(next);
}

void Skeleton::arm_timer(Clock::time_point when) {
  if (when == timer_armed_for_ || !timer_fd_) return;
  timer_armed_for_ = when;
  base::arm_timerfd(timer_fd_.get(), when);
}

int read_with_fd(int fd, unsigned char* buf, std::size_t* got, std::size_t need, base::UniqueFd* passed, int* err) {
  while (*got < need) {
    iovec iov{buf + *got, need - *got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t r = ::recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      *err = errno;
      return -2;
    }
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
      if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
      const std::size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < n; ++i) {
        int f = -1;
        std::memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
        if (passed != nullptr && !*passed) {
          passed->reset(f);
        } else {
          ::close(f);
        }
      }
    }
    if (r == 0) return -1;
    *got += static_cast<std::size_t>(r);
  }
  return 1;
}

}  // namespace braid::transport
