// braid TCP transport.
//
// Wire protocol (all integers little-endian; layouts in tcp/wire.hpp, prose in
// docs/transport-tcp.md):
// - Each rank listens on one socket and publishes "ip:port" under key "tcp". For a
//   pair (a, b) with a < b, rank a opens sockets_per_peer sockets to b; each starts
//   with a Hello {magic "BRDH", version, socket_index, sockets_per_peer, token
//   length, from_rank, to_rank, comm_id} and the token. b checks it; anything that
//   is not an authenticated peer of this communicator is closed silently.
// - After the hello both directions carry message parts: a 40-byte PartHeader
//   {magic "BRDM", version, part_index, seq, tag, msg_bytes, part_bytes}, then the
//   payload. A message of n bytes is cut into parts = min(sockets, max(1, n/64KiB))
//   equal contiguous parts; part i goes to socket (seq + i) % sockets. Each socket
//   is a FIFO, and both sides derive the split from (seq, n), so the receiver knows
//   which socket carries which part of which message.
// - The receiver reads a socket's next header eagerly, but its payload only once a
//   receive has been posted for that message (TCP flow control is the back-pressure);
//   payload goes straight into the user's buffer. Part 0 (on socket seq % sockets)
//   is checked against the posted receive (tag, size) before any other part is
//   accepted, so a size mismatch is reported as such and not as a stray part.
//
// Progress model: all sockets are non-blocking and edge-triggered in the Poller.
// Poller handlers only record readiness (readable / writable flags); every read,
// write, accept and connect step happens in progress(). A socket is read until
// EAGAIN, a short read, a missing receive, or a 4 MiB budget per call; likewise for
// writes, so one large transfer cannot starve the others. EPOLLOUT is registered
// only while a socket has data it could not write.
#include "transport/tcp/tcp_transport.hpp"

#include "base/text.hpp"
#include "transport/common.hpp"
#include "transport/tcp/wire.hpp"

#include <braid/error.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <exception>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

namespace braid::transport {

namespace {

namespace wire = tcp_wire;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::size_t kHeader = wire::kPartHeaderBytes;
/// Bytes one socket may move in one direction per progress() call.
constexpr std::size_t kIoBudget = std::size_t{4} << 20;
constexpr int kMaxIov = 64;
/// Accepted sockets that have not finished their hello; the oldest is dropped beyond.
constexpr std::size_t kMaxPendingAccepts = 64;
constexpr int kMaxSocketsPerPeer = 64;
constexpr milliseconds kFirstRetry{10};
constexpr milliseconds kMaxRetry{500};
constexpr std::uint32_t kDataEvents = EPOLLIN | EPOLLRDHUP | EPOLLET;

std::string hex(std::uint64_t v) { return "0x" + base::hex(v); }

struct SendPart {
  std::uint64_t seq = 0;
  const unsigned char* data = nullptr;
  std::size_t len = 0;
  std::size_t sent = 0;  // header + payload bytes written so far
  unsigned char header[kHeader] = {};
};

struct RecvPart {
  std::uint64_t seq = 0;
  std::uint16_t index = 0;
  unsigned char* data = nullptr;
  std::size_t len = 0;
};

struct SendOp {
  Request* req = nullptr;
  int parts_left = 0;
};

struct RecvOp {
  Request* req = nullptr;
  std::uint64_t tag = 0;
  std::size_t bytes = 0;
  int parts_left = 0;
  bool validated = false;  // part 0's header matched tag and size
};

class TcpConnection;

struct Sock {
  enum class Phase : std::uint8_t { idle, connecting, retry_wait, up, closed };
  TcpConnection* conn = nullptr;
  int index = 0;
  int fd = -1;
  Phase phase = Phase::idle;
  // Readiness as last reported by the (edge-triggered) poller or learnt by I/O.
  bool readable = false;
  bool writable = false;
  bool hup = false;       // peer shut down or error reported: read until EOF
  bool want_out = false;  // EPOLLOUT registered
  bool eof = false;       // clean EOF at a message boundary
  // Connecting side.
  Clock::time_point retry_at{};
  milliseconds backoff = kFirstRetry;
  std::string hello;
  std::size_t hello_sent = 0;
  // Send side.
  Fifo<SendPart> sendq;
  // Receive side: the parts expected on this socket, in order, and the state of the
  // part being read.
  Fifo<RecvPart> recvq;
  unsigned char hdr[kHeader] = {};
  std::size_t hdr_got = 0;
  bool hdr_decoded = false;
  bool matched = false;
  wire::PartHeader cur;
  std::size_t payload_got = 0;
};

struct PendingAccept {
  int fd = -1;
  bool readable = true;
  Clock::time_point deadline{};
  std::vector<unsigned char> buf = std::vector<unsigned char>(wire::kHelloBytes);
  std::size_t got = 0;
  wire::Hello hello;
};

class TcpTransport;

class TcpConnection final : public Connection {
 public:
  enum class Setup : std::uint8_t { idle, wanted, lookup, connecting, done };

  TcpConnection(TcpTransport& t, int peer, int my_rank, int sockets)
      : t_(t), peer_(peer), connector_(my_rank < peer) {
    socks_.reserve(static_cast<std::size_t>(sockets));
    for (int i = 0; i < sockets; ++i) {
      auto s = std::make_unique<Sock>();
      s->conn = this;
      s->index = i;
      socks_.push_back(std::move(s));
    }
  }

  int peer() const noexcept override { return peer_; }
  void send(const void* buf, std::size_t bytes, std::uint64_t tag, Request* req) override;
  void recv(void* buf, std::size_t bytes, std::uint64_t tag, Request* req) override;
  bool broken(std::string* why) const override {
    if (failed_) {
      if (why) *why = error_;
      return true;
    }
    if (eof_seen_) {
      if (why) *why = who() + " closed by peer";
      return true;
    }
    return false;
  }

  /// "connection to rank 3 (10.0.0.2:4567)" for error messages.
  std::string who() const {
    std::string s = "connection to rank " + std::to_string(peer_);
    if (!addr_text_.empty()) s += " (" + addr_text_ + ")";
    return s;
  }

  TcpTransport& t_;
  const int peer_;
  const bool connector_;  // this rank opens the sockets
  Setup setup_ = Setup::idle;
  std::vector<std::unique_ptr<Sock>> socks_;
  sockaddr_in addr_{};
  std::string addr_text_;
  Clock::time_point deadline_{};
  Clock::time_point lookup_deadline_{};  // give up waiting for the peer's address
  Clock::time_point lookup_retry_at_{};
  milliseconds lookup_backoff_{1};
  int last_errno_ = 0;

  Fifo<SendOp> sends_;
  std::uint64_t send_base_ = 0;  // seq of sends_.front()
  std::uint64_t send_next_ = 0;
  Fifo<RecvOp> recvs_;
  std::uint64_t recv_base_ = 0;
  std::uint64_t recv_next_ = 0;

  bool failed_ = false;
  std::string error_;
  bool error_closed_ = false;
  int error_blame_ = -1;
  bool eof_seen_ = false;  // some socket reached EOF between messages
};

// `deadline` > 0 arms dead-peer detection: a peer whose kernel acknowledges nothing
// (data, or keepalive probes on an idle socket) for half the deadline, at most 30 s,
// is unreachable (cable, link or host gone), and the socket fails with ETIMEDOUT
// naming that peer, before the collective's own deadline blames whichever rank
// happened to be waiting. A live peer that is merely slow or late still acknowledges
// (zero-window probes included), so this never fires on it.
void tune_socket(int fd, std::size_t buffer, std::chrono::milliseconds deadline = std::chrono::milliseconds(0)) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (deadline.count() > 0) {
    const long long ms = std::clamp<long long>(deadline.count() / 2, 1000, 30000);
    const unsigned user_timeout = static_cast<unsigned>(ms);
    const int probe_s = static_cast<int>(std::max<long long>(1, ms / 3000));
    ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
    ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &probe_s, sizeof probe_s);
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &probe_s, sizeof probe_s);
  }
  if (buffer > 0) {
    int b = buffer > static_cast<std::size_t>(INT_MAX) ? INT_MAX : static_cast<int>(buffer);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof b);
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof b);
  }
}

std::string sockaddr_text(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
  return std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
}

bool parse_addr(const std::string& text, sockaddr_in* out) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= text.size() || text.size() > 64) {
    return false;
  }
  const std::string ip = text.substr(0, colon), port = text.substr(colon + 1);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return false;
  const long p = std::stol(port);
  if (p <= 0 || p > 65535) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(p));
  if (::inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) return false;
  *out = a;
  return true;
}

bool retriable_connect_error(int err) {
  return err == ECONNREFUSED || err == ETIMEDOUT || err == ECONNABORTED || err == ECONNRESET ||
         err == EHOSTUNREACH || err == ENETUNREACH || err == EAGAIN;
}

class TcpTransport final : public Transport {
 public:
  TcpTransport(const TcpOptions& options, Poller& poller, PeerDirectory& directory);
  ~TcpTransport() override;
  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;

  const char* name() const noexcept override { return "tcp"; }
  Connection* connection(int peer) override;
  bool progress() override;
  void close_all(const std::string& reason) override;

  /// Fails every pending request of `c` with `msg` and closes its sockets; later
  /// requests fail with the same message.
  void fail(TcpConnection& c, const std::string& msg, bool closed, int blame);
  int nsock() const noexcept { return opts_.sockets_per_peer; }

 private:
  TcpConnection& get_conn(int peer);
  void shutdown_fds() noexcept;
  void close_sock(Sock& s) noexcept;
  void watch_data(Sock& s);
  void set_want_out(Sock& s, bool on);
  void fail_io(TcpConnection& c, int err, const char* op);

  bool progress_connection(TcpConnection& c);
  std::size_t write_some(TcpConnection& c, Sock& s);
  std::size_t read_some(TcpConnection& c, Sock& s);
  bool match_part(TcpConnection& c, Sock& s, const RecvPart& p, RecvOp& op);
  void on_eof(TcpConnection& c, Sock& s, bool at_boundary);
  bool complete(TcpConnection& c);

  void start_connect(TcpConnection& c);
  void open_socket(TcpConnection& c, Sock& s);
  void finish_connect(TcpConnection& c, Sock& s);
  void connect_failed(TcpConnection& c, Sock& s, int err);
  void on_connected(TcpConnection& c, Sock& s);

  void accept_all();
  bool service_hellos();
  int read_hello(PendingAccept& pa);
  bool adopt(int fd, const PendingAccept& pa);
  void drop_pending(std::size_t i) noexcept;
  void service_deadlines();
  void arm_timer(Clock::time_point when);

  TcpOptions opts_;
  Poller& poller_;
  PeerDirectory& directory_;
  int listen_fd_ = -1;
  int timer_fd_ = -1;
  std::string listen_text_;
  std::vector<std::unique_ptr<TcpConnection>> by_rank_;
  std::vector<TcpConnection*> conns_;  // created connections, in creation order
  std::vector<std::unique_ptr<PendingAccept>> pending_;
  bool listen_ready_ = false;
  bool timer_fired_ = false;
  bool deadlines_dirty_ = false;
  Clock::time_point timer_armed_for_ = Clock::time_point::max();
  bool changed_ = false;  // a request failed outside the byte-moving paths
  bool closed_ = false;
  std::string closed_reason_;
};

// ---------------------------------------------------------------------------
// Posting.

void TcpConnection::send(const void* buf, std::size_t bytes, std::uint64_t tag, Request* req) {
  check_post("tcp", "send", buf, bytes, req, peer_);
  start_request(req);
  if (eof_seen_ && !failed_) t_.fail(*this, who() + " closed by peer", true, peer_);
  if (failed_) {
    fail_request(req, error_, error_blame_, error_closed_);
    return;
  }
  const int sockets = static_cast<int>(socks_.size());
  const std::uint64_t seq = send_next_++;
  const int parts = wire::part_count(bytes, sockets);
  sends_.push_back(SendOp{req, parts});
  const auto* data = static_cast<const unsigned char*>(buf);
  for (int i = 0; i < parts; ++i) {
    std::size_t off = 0, len = 0;
    wire::part_range(bytes, parts, i, &off, &len);
    SendPart p;
    p.seq = seq;
    p.data = data == nullptr ? nullptr : data + off;
    p.len = len;
    wire::PartHeader h;
    h.part_index = static_cast<std::uint16_t>(i);
    h.seq = seq;
    h.tag = tag;
    h.msg_bytes = bytes;
    h.part_bytes = len;
    wire::encode(h, p.header);
    socks_[static_cast<std::size_t>(wire::part_socket(seq, i, sockets))]->sendq.push_back(p);
  }
}

void TcpConnection::recv(void* buf, std::size_t bytes, std::uint64_t tag, Request* req) {
  check_post("tcp", "recv", buf, bytes, req, peer_);
  start_request(req);
  const int sockets = static_cast<int>(socks_.size());
  const std::uint64_t seq = recv_next_;
  const int parts = wire::part_count(bytes, sockets);
  if (eof_seen_ && !failed_) {
    for (int i = 0; i < parts; ++i) {
      if (socks_[static_cast<std::size_t>(wire::part_socket(seq, i, sockets))]->eof) {
        t_.fail(*this, who() + " closed by peer", true, peer_);
        break;
      }
    }
  }
  if (failed_) {
    fail_request(req, error_, error_blame_, error_closed_);
    return;
  }
  ++recv_next_;
  recvs_.push_back(RecvOp{req, tag, bytes, parts, false});
  auto* data = static_cast<unsigned char*>(buf);
  for (int i = 0; i < parts; ++i) {
    std::size_t off = 0, len = 0;
    wire::part_range(bytes, parts, i, &off, &len);
    RecvPart p;
    p.seq = seq;
    p.index = static_cast<std::uint16_t>(i);
    p.data = data == nullptr ? nullptr : data + off;
    p.len = len;
    socks_[static_cast<std::size_t>(wire::part_socket(seq, i, sockets))]->recvq.push_back(p);
  }
}

// ---------------------------------------------------------------------------
// Set-up and teardown.

TcpTransport::TcpTransport(const TcpOptions& options, Poller& poller, PeerDirectory& directory)
    : opts_(options), poller_(poller), directory_(directory) {
  by_rank_.resize(static_cast<std::size_t>(opts_.size));
  const std::string ip = select_address(opts_.ifname, opts_.master_addr);
  const std::string where =
      !opts_.ifname.empty() ? "interface " + opts_.ifname + " (" + ip + ")" : ip;
  try {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) {
      throw Error(ErrorCode::Network, "tcp transport (rank " + std::to_string(opts_.rank) +
                                          "): socket() failed: " + errno_text(errno));
    }
    // Set before listen() so that accepted sockets inherit them with window scaling.
    tune_socket(listen_fd_, opts_.socket_buffer);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = 0;
    ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
    if (::bind(listen_fd_, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listen_fd_, SOMAXCONN) != 0) {
      throw Error(ErrorCode::Network, "tcp transport (rank " + std::to_string(opts_.rank) +
                                          "): cannot listen on " + where + ": " +
                                          errno_text(errno) +
                                          "; set BRAID_SOCKET_IFNAME to a usable interface");
    }
    socklen_t len = sizeof a;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    listen_text_ = sockaddr_text(a);

    timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (timer_fd_ < 0) {
      throw Error(ErrorCode::System, std::string("tcp transport: timerfd_create: ") + errno_text(errno));
    }
    poller_.watch(listen_fd_, EPOLLIN | EPOLLET, [this](std::uint32_t) { listen_ready_ = true; });
    poller_.watch(timer_fd_, EPOLLIN, [this](std::uint32_t) {
      std::uint64_t expirations;
      while (::read(timer_fd_, &expirations, sizeof expirations) > 0) {
      }
      timer_fired_ = true;
    });
    directory_.publish("tcp", listen_text_);
  } catch (...) {
    shutdown_fds();
    throw;
  }
}

TcpTransport::~TcpTransport() {
  // Requests may already be gone; only the fds are released here (close_all fails
  // pending requests and is what an orderly shutdown calls first).
  shutdown_fds();
}

void TcpTransport::shutdown_fds() noexcept {
  for (TcpConnection* c : conns_) {
    for (auto& s : c->socks_) close_sock(*s);
  }
  while (!pending_.empty()) drop_pending(pending_.size() - 1);
  if (listen_fd_ >= 0) {
    poller_.unwatch(listen_fd_);
    ::close(listen_fd_);
    listen_fd_ = -1;
  }
  if (timer_fd_ >= 0) {
    poller_.unwatch(timer_fd_);
    ::close(timer_fd_);
    timer_fd_ = -1;
  }
}

void TcpTransport::close_sock(Sock& s) noexcept {
  if (s.fd >= 0) {
    poller_.unwatch(s.fd);
    ::close(s.fd);
    s.fd = -1;
  }
  s.phase = Sock::Phase::closed;
  s.readable = s.writable = s.want_out = false;
}

TcpConnection& TcpTransport::get_conn(int peer) {
  auto& slot = by_rank_[static_cast<std::size_t>(peer)];
  if (!slot) {
    slot = std::make_unique<TcpConnection>(*this, peer, opts_.rank, opts_.sockets_per_peer);
    conns_.push_back(slot.get());
    if (closed_) {
      slot->failed_ = true;
      slot->error_ = closed_reason_;
      for (auto& s : slot->socks_) s->phase = Sock::Phase::closed;
    }
  }
  return *slot;
}

Connection* TcpTransport::connection(int peer) {
  if (peer < 0 || peer >= opts_.size || peer == opts_.rank) {
    throw Error(ErrorCode::InvalidUsage, "tcp transport: no connection from rank " +
                                             std::to_string(opts_.rank) + " to rank " +
                                             std::to_string(peer) + " (world size " +
                                             std::to_string(opts_.size) + ")");
  }
  TcpConnection& c = get_conn(peer);
  if (c.connector_ && c.setup_ == TcpConnection::Setup::idle && !c.failed_) {
    c.setup_ = TcpConnection::Setup::wanted;  // connect on the next progress()
  }
  return &c;
}

void TcpTransport::fail(TcpConnection& c, const std::string& msg, bool closed, int blame) {
  if (c.failed_) return;
  complete(c);  // requests whose bytes all moved are done, whatever comes after them
  c.failed_ = true;
  c.error_ = msg;
  c.error_closed_ = closed;
  c.error_blame_ = blame;
  c.setup_ = TcpConnection::Setup::done;
  for (auto& s : c.socks_) {
    close_sock(*s);
    s->sendq.clear();
    s->recvq.clear();
  }
  for (std::size_t i = 0; i < c.sends_.size(); ++i) fail_request(c.sends_[i].req, msg, blame, closed);
  for (std::size_t i = 0; i < c.recvs_.size(); ++i) fail_request(c.recvs_[i].req, msg, blame, closed);
  c.sends_.clear();
  c.recvs_.clear();
  changed_ = true;
}

void TcpTransport::close_all(const std::string& reason) {
  if (closed_) return;
  closed_ = true;
  closed_reason_ = reason;
  for (TcpConnection* c : conns_) fail(*c, reason, false, -1);
  shutdown_fds();
}

void TcpTransport::fail_io(TcpConnection& c, int err, const char* op) {
  if (err == ECONNRESET || err == EPIPE || err == ECONNABORTED) {
    fail(c, c.who() + " reset: " + errno_text(err), true, c.peer_);
  } else if (err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH) {
    // Dead-peer detection (see tune_socket) or routing: the peer did not close, it is
    // out of reach, so there is no reason of its own to look up (closed = false).
    fail(c, c.who() + " is unreachable: " + op + ": " + errno_text(err) +
                " (no TCP acknowledgement: link, network or host down)",
         false, c.peer_);
  } else {
    fail(c, c.who() + " failed: " + op + ": " + errno_text(err), true, c.peer_);
  }
}

// ---------------------------------------------------------------------------
// Poller registration.

void TcpTransport::watch_data(Sock& s) {
  poller_.watch(s.fd, kDataEvents | (s.want_out ? std::uint32_t{EPOLLOUT} : 0u),
                [p = &s](std::uint32_t ev) {
                  if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) p->readable = true;
                  if (ev & (EPOLLOUT | EPOLLHUP | EPOLLERR)) p->writable = true;
                  if (ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) p->hup = true;
                });
}

void TcpTransport::set_want_out(Sock& s, bool on) {
  if (s.want_out == on || s.fd < 0) return;
  s.want_out = on;
  watch_data(s);
}

// ---------------------------------------------------------------------------
// Progress.

bool TcpTransport::progress() {
  if (closed_) return false;
  changed_ = false;
  bool moved = false;
  if (timer_fired_ || deadlines_dirty_) service_deadlines();
  if (listen_ready_) accept_all();
  if (!pending_.empty()) moved |= service_hellos();
  for (std::size_t i = 0; i < conns_.size(); ++i) moved |= progress_connection(*conns_[i]);
  // A retry scheduled just now must arm the timer before the caller may sleep.
  if (deadlines_dirty_) service_deadlines();
  return moved || changed_;
}

bool TcpTransport::progress_connection(TcpConnection& c) {
  if (c.failed_) return false;
  if (c.setup_ == TcpConnection::Setup::wanted) start_connect(c);
  bool moved = false;
  for (auto& sp : c.socks_) {
    if (c.failed_) break;
    Sock& s = *sp;
    if (s.phase == Sock::Phase::connecting && s.writable) finish_connect(c, s);
    if (s.phase != Sock::Phase::up) continue;
    if (!s.sendq.empty() || s.hello_sent < s.hello.size()) {
      if (s.writable && write_some(c, s) > 0) moved = true;
    } else if (s.want_out) {
      set_want_out(s, false);
    }
    if (c.failed_) break;
    // A header already read (e.g. with the previous payload) needs no readiness.
    if ((s.readable || s.hdr_got == kHeader) && read_some(c, s) > 0) moved = true;
  }
  if (!c.failed_ && complete(c)) moved = true;
  return moved;
}

std::size_t TcpTransport::write_some(TcpConnection& c, Sock& s) {
  std::size_t total = 0;
  iovec iov[kMaxIov];
  while (total < kIoBudget) {
    const std::size_t budget = kIoBudget - total;
    int n = 0;
    std::size_t want = 0;
    if (s.hello_sent < s.hello.size()) {
      iov[n++] = {&s.hello[s.hello_sent], s.hello.size() - s.hello_sent};
      want += s.hello.size() - s.hello_sent;
    }
    for (std::size_t i = 0; i < s.sendq.size() && n + 2 <= kMaxIov && want < budget; ++i) {
      SendPart& p = s.sendq[i];
      if (p.sent < kHeader) {
        iov[n++] = {p.header + p.sent, kHeader - p.sent};
        want += kHeader - p.sent;
      }
      const std::size_t done = p.sent > kHeader ? p.sent - kHeader : 0;
      const std::size_t rest = p.len - done;
      if (rest == 0) continue;
      const std::size_t take = std::min(rest, budget > want ? budget - want : 0);
      if (take == 0) break;
      iov[n++] = {const_cast<unsigned char*>(p.data) + done, take};
      want += take;
      if (take < rest) break;
    }
    if (n == 0) break;
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(n);
    const ssize_t r = ::sendmsg(s.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        s.writable = false;
        set_want_out(s, true);
        break;
      }
      fail_io(c, err, "send");
      return total;
    }
    const auto written = static_cast<std::size_t>(r);
    total += written;
    std::size_t left = written;
    if (s.hello_sent < s.hello.size()) {
      const std::size_t k = std::min(left, s.hello.size() - s.hello_sent);
      s.hello_sent += k;
      left -= k;
    }
    while (left > 0) {
      SendPart& p = s.sendq.front();
      const std::size_t need = kHeader + p.len - p.sent;
      if (left < need) {
        p.sent += left;
        left = 0;
        break;
      }
      left -= need;
      --c.sends_[p.seq - c.send_base_].parts_left;
      s.sendq.pop_front();
    }
    if (written < want) {
      // The socket buffer is full; a later EPOLLOUT edge says when it drains.
      s.writable = false;
      set_want_out(s, true);
      break;
    }
  }
  if (s.sendq.empty() && s.hello_sent == s.hello.size() && s.want_out) set_want_out(s, false);
  return total;
}

std::size_t TcpTransport::read_some(TcpConnection& c, Sock& s) {
  std::size_t total = 0;
  while (total < kIoBudget) {
    if (s.hdr_got < kHeader) {
      if (!s.readable) break;
      const ssize_t r = ::recv(s.fd, s.hdr + s.hdr_got, kHeader - s.hdr_got, 0);
      if (r == 0) {
        on_eof(c, s, s.hdr_got == 0);
        return total;
      }
      if (r < 0) {
        const int err = errno;
        if (err == EINTR) continue;
        if (err == EAGAIN || err == EWOULDBLOCK) {
          s.readable = false;
          break;
        }
        fail_io(c, err, "recv");
        return total;
      }
      s.hdr_got += static_cast<std::size_t>(r);
      total += static_cast<std::size_t>(r);
      if (s.hdr_got < kHeader) {
        // A short read drained the socket; the next arrival raises a new edge. After
        // a hang-up keep reading so that EOF is seen.
        if (!s.hup) s.readable = false;
        continue;
      }
    }
    if (!s.hdr_decoded) {
      s.cur = wire::decode_part(s.hdr);
      if (s.cur.magic != wire::kPartMagic || s.cur.version != wire::kVersion) {
        fail(c, c.who() + ": corrupt message header on socket " + std::to_string(s.index) +
                    " (magic " + hex(s.cur.magic) + ", version " + std::to_string(s.cur.version) +
                    "; expected magic " + hex(wire::kPartMagic) + ", version " +
                    std::to_string(wire::kVersion) + "): not a braid peer of the same version, or a corrupted stream",
             false, c.peer_);
        return total;
      }
      s.hdr_decoded = true;
      s.matched = false;
      s.payload_got = 0;
    }
    if (!s.matched) {
      if (s.recvq.empty()) break;  // no receive posted yet: leave the payload in the kernel
      RecvPart& p = s.recvq.front();
      RecvOp& op = c.recvs_[p.seq - c.recv_base_];
      if (p.index != 0 && !op.validated) break;  // part 0 is checked first
      if (!match_part(c, s, p, op)) return total;
      s.matched = true;
    }
    RecvPart& p = s.recvq.front();
    const std::size_t rest = p.len - s.payload_got;
    std::size_t extra = 0;
    if (rest > 0) {
      if (!s.readable) break;
      const std::size_t take = std::min(rest, kIoBudget - total);
      // When this read can finish the part, also take the next header if it is there.
      iovec iov[2] = {{p.data + s.payload_got, take}, {s.hdr, kHeader}};
      const ssize_t r = ::readv(s.fd, iov, take == rest ? 2 : 1);
      if (r == 0) {
        on_eof(c, s, false);
        return total;
      }
      if (r < 0) {
        const int err = errno;
        if (err == EINTR) continue;
        if (err == EAGAIN || err == EWOULDBLOCK) {
          s.readable = false;
          break;
        }
        fail_io(c, err, "recv");
        return total;
      }
      const auto got = static_cast<std::size_t>(r);
      total += got;
      const std::size_t payload = std::min(got, take);
      s.payload_got += payload;
      extra = got - payload;
      if (got < take + (take == rest ? kHeader : 0) && !s.hup) s.readable = false;
      if (s.payload_got < p.len) continue;
    }
    --c.recvs_[p.seq - c.recv_base_].parts_left;
    s.recvq.pop_front();
    s.hdr_got = extra;
    s.hdr_decoded = false;
    s.matched = false;
  }
  return total;
}

bool TcpTransport::match_part(TcpConnection& c, Sock& s, const RecvPart& p, RecvOp& op) {
  const wire::PartHeader& h = s.cur;
  if (h.seq != p.seq || h.part_index != p.index) {
    fail(c, c.who() + ": protocol error on socket " + std::to_string(s.index) +
                ": expected message #" + std::to_string(p.seq) + " part " + std::to_string(p.index) +
                ", got message #" + std::to_string(h.seq) + " part " + std::to_string(h.part_index),
         false, c.peer_);
    return false;
  }
  if (h.tag != op.tag || h.msg_bytes != op.bytes) {
    if (p.index == 0) {
      fail(c, "message #" + std::to_string(p.seq) + " from rank " + std::to_string(c.peer_) +
                  " does not match the posted receive: expected tag " + std::to_string(op.tag) +
                  " and " + std::to_string(op.bytes) + " bytes, got tag " + std::to_string(h.tag) +
                  " and " + std::to_string(h.msg_bytes) + " bytes (" + c.who() +
                  "); the ranks disagree about the operation they are running",
           false, c.peer_);
    } else {
      fail(c, c.who() + ": protocol error: part " + std::to_string(p.index) + " of message #" +
                  std::to_string(p.seq) + " carries tag " + std::to_string(h.tag) + " and size " +
                  std::to_string(h.msg_bytes) + ", but part 0 carried tag " + std::to_string(op.tag) +
                  " and size " + std::to_string(op.bytes),
           false, c.peer_);
    }
    return false;
  }
  if (h.part_bytes != p.len) {
    fail(c, c.who() + ": protocol error: part " + std::to_string(p.index) + " of message #" +
                std::to_string(p.seq) + " (" + std::to_string(op.bytes) + " bytes) has length " +
                std::to_string(h.part_bytes) + ", expected " + std::to_string(p.len),
         false, c.peer_);
    return false;
  }
  if (p.index == 0) op.validated = true;
  return true;
}

void TcpTransport::on_eof(TcpConnection& c, Sock& s, bool at_boundary) {
  if (!at_boundary) {
    fail(c, c.who() + " closed by peer in the middle of a message", true, c.peer_);
    return;
  }
  // A clean end between messages is only an error for someone waiting on this
  // socket; parts already queued on the peer's other sockets can still arrive.
  close_sock(s);
  s.eof = true;
  c.eof_seen_ = true;
  if (!c.sends_.empty() || !s.recvq.empty()) fail(c, c.who() + " closed by peer", true, c.peer_);
}

bool TcpTransport::complete(TcpConnection& c) {
  bool any = false;
  while (!c.sends_.empty() && c.sends_.front().parts_left == 0) {
    c.sends_.front().req->state = Request::State::done;
    c.sends_.pop_front();
    ++c.send_base_;
    any = true;
  }
  while (!c.recvs_.empty() && c.recvs_.front().parts_left == 0) {
    c.recvs_.front().req->state = Request::State::done;
    c.recvs_.pop_front();
    ++c.recv_base_;
    any = true;
  }
  return any;
}

// ---------------------------------------------------------------------------
// Connecting (the lower rank of a pair).

void TcpTransport::start_connect(TcpConnection& c) {
  // The peer's address comes from the store. Never block the progress thread on it
  // (the engine must keep honouring deadlines and abort()): poll without waiting,
  // with backoff, until connect_timeout.
  const auto now = Clock::now();
  if (c.setup_ == TcpConnection::Setup::wanted) {
    c.lookup_deadline_ = now + opts_.connect_timeout;
    c.lookup_backoff_ = milliseconds(1);
  }
  c.setup_ = TcpConnection::Setup::lookup;
  std::optional<std::string> found;
  try {
    found = directory_.try_lookup(c.peer_, "tcp");
  } catch (const std::exception& e) {
    fail(c, "cannot connect to rank " + std::to_string(c.peer_) +
                ": looking up its TCP address failed: " + e.what(),
         false, c.peer_);
    return;
  }
  if (!found) {
    if (now >= c.lookup_deadline_) {
      fail(c, "cannot connect to rank " + std::to_string(c.peer_) + ": it did not publish its TCP address within " +
                  std::to_string(opts_.connect_timeout.count()) + " ms (has it started?)",
           false, c.peer_);
      return;
    }
    c.lookup_retry_at_ = now + c.lookup_backoff_;
    c.lookup_backoff_ = std::min(c.lookup_backoff_ * 2, milliseconds(50));
    deadlines_dirty_ = true;
    return;
  }
  const std::string& value = *found;
  c.setup_ = TcpConnection::Setup::connecting;
  if (!parse_addr(value, &c.addr_)) {
    fail(c, "cannot connect to rank " + std::to_string(c.peer_) + ": it published the TCP address '" +
                value.substr(0, 80) + "', expected ip:port",
         false, c.peer_);
    return;
  }
  c.addr_text_ = sockaddr_text(c.addr_);
  c.deadline_ = Clock::now() + opts_.connect_timeout;
  for (auto& s : c.socks_) {
    if (c.failed_) break;
    open_socket(c, *s);
  }
  deadlines_dirty_ = true;
}

void TcpTransport::open_socket(TcpConnection& c, Sock& s) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    fail(c, "cannot connect to rank " + std::to_string(c.peer_) + ": socket() failed: " + errno_text(errno),
         false, c.peer_);
    return;
  }
  tune_socket(fd, opts_.socket_buffer, opts_.connect_timeout);
  s.fd = fd;
  s.phase = Sock::Phase::connecting;
  s.readable = s.writable = s.hup = false;
  s.want_out = true;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&c.addr_), sizeof c.addr_) == 0) {
    on_connected(c, s);
    return;
  }
  const int err = errno;
  if (err != EINPROGRESS && err != EINTR) {
    connect_failed(c, s, err);
    return;
  }
  watch_data(s);  // EPOLLOUT (or ERR/HUP) reports the outcome
}

void TcpTransport::finish_connect(TcpConnection& c, Sock& s) {
  int err = 0;
  socklen_t len = sizeof err;
  if (::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err == 0) {
    on_connected(c, s);
  } else {
    connect_failed(c, s, err);
  }
}

void TcpTransport::connect_failed(TcpConnection& c, Sock& s, int err) {
  close_sock(s);
  c.last_errno_ = err;
  const auto now = Clock::now();
  if (!retriable_connect_error(err) || now >= c.deadline_) {
    fail(c, "cannot connect to rank " + std::to_string(c.peer_) + " at " + c.addr_text_ +
                (retriable_connect_error(err)
                     ? " within " + std::to_string(opts_.connect_timeout.count()) + " ms (last error: "
                     : " (") +
                errno_text(err) + ")",
         true, c.peer_);
    return;
  }
  s.phase = Sock::Phase::retry_wait;
  s.retry_at = std::min(now + s.backoff, c.deadline_);
  s.backoff = std::min(s.backoff * 2, kMaxRetry);
  deadlines_dirty_ = true;
}

void TcpTransport::on_connected(TcpConnection& c, Sock& s) {
  s.phase = Sock::Phase::up;
  s.readable = s.writable = true;
  s.want_out = true;  // until the hello and anything queued are written
  wire::Hello h;
  h.socket_index = static_cast<std::uint16_t>(s.index);
  h.sockets_per_peer = static_cast<std::uint16_t>(opts_.sockets_per_peer);
  h.token_bytes = static_cast<std::uint16_t>(opts_.auth_token.size());
  h.from_rank = opts_.rank;
  h.to_rank = c.peer_;
  h.comm_id = opts_.comm_id;
  s.hello = wire::hello_bytes(h, opts_.auth_token);
  s.hello_sent = 0;
  watch_data(s);
  bool all_up = true;
  for (auto& o : c.socks_) all_up = all_up && o->phase == Sock::Phase::up;
  if (all_up) c.setup_ = TcpConnection::Setup::done;
}

// ---------------------------------------------------------------------------
// Accepting (the higher rank of a pair).

void TcpTransport::accept_all() {
  listen_ready_ = false;
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EINTR || err == ECONNABORTED) continue;
      // EAGAIN: drained. EMFILE and friends: try again on the next connection.
      break;
    }
    tune_socket(fd, 0, opts_.connect_timeout);
    if (pending_.size() >= kMaxPendingAccepts) drop_pending(0);
    auto pa = std::make_unique<PendingAccept>();
    pa->fd = fd;
    pa->deadline = Clock::now() + std::max(opts_.connect_timeout, milliseconds(1000));
    PendingAccept* raw = pa.get();
    pending_.push_back(std::move(pa));
    poller_.watch(fd, EPOLLIN | EPOLLRDHUP | EPOLLET, [raw](std::uint32_t) { raw->readable = true; });
    deadlines_dirty_ = true;
  }
}

void TcpTransport::drop_pending(std::size_t i) noexcept {
  PendingAccept& pa = *pending_[i];
  if (pa.fd >= 0) {
    poller_.unwatch(pa.fd);
    ::close(pa.fd);
  }
  pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
}

// 1: complete, 0: needs more bytes, -1: not a valid hello.
int TcpTransport::read_hello(PendingAccept& pa) {
  for (;;) {
    const std::size_t need =
        pa.got < wire::kHelloBytes ? wire::kHelloBytes : wire::kHelloBytes + pa.hello.token_bytes;
    if (pa.got == need) return 1;
    const ssize_t r = ::recv(pa.fd, pa.buf.data() + pa.got, need - pa.got, 0);
    if (r == 0) return -1;
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        pa.readable = false;
        return 0;
      }
      return -1;
    }
    const std::size_t before = pa.got;
    pa.got += static_cast<std::size_t>(r);
    if (before < 4 && pa.got >= 4) {
      // Refuse strangers (port scanners, HTTP probes) without waiting for 28 bytes.
      unsigned char magic[4];
      wire::detail::put(magic, wire::kHelloMagic, 4);
      if (std::memcmp(pa.buf.data(), magic, 4) != 0) return -1;
    }
    if (pa.got == wire::kHelloBytes) {
      pa.hello = wire::decode_hello(pa.buf.data());
      if (pa.hello.magic != wire::kHelloMagic || pa.hello.version != wire::kVersion ||
          pa.hello.token_bytes > wire::kMaxTokenBytes) {
        return -1;
      }
      pa.buf.resize(wire::kHelloBytes + pa.hello.token_bytes);
    }
  }
}

bool TcpTransport::service_hellos() {
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
    if (verdict > 0 && adopt(pa.fd, pa)) {
      pa.fd = -1;  // now owned by a connection
    } else if (opts_.on_refused) {
      sockaddr_in from{};
      socklen_t len = sizeof from;
      const bool known = ::getpeername(pa.fd, reinterpret_cast<sockaddr*>(&from), &len) == 0;
      opts_.on_refused("refused an incoming connection" + (known ? " from " + sockaddr_text(from) : std::string()) +
                       (verdict > 0 ? ": its hello names another communicator, rank or token"
                                    : ": not a braid hello of this version"));
    }
    drop_pending(i);
  }
  return moved;
}

bool TcpTransport::adopt(int fd, const PendingAccept& pa) {
  const wire::Hello& h = pa.hello;
  // Anything that is not an authenticated peer of this communicator is closed
  // without a word: it must not be able to disturb the real connections.
  if (closed_ || h.comm_id != opts_.comm_id ||
      !token_equal(pa.buf.data() + wire::kHelloBytes, h.token_bytes, opts_.auth_token) ||
      h.to_rank != opts_.rank || h.from_rank < 0 || h.from_rank >= opts_.rank) {
    return false;
  }
  TcpConnection& c = get_conn(h.from_rank);
  if (c.failed_) return false;
  if (c.addr_text_.empty()) {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) c.addr_text_ = sockaddr_text(a);
  }
  if (h.sockets_per_peer != opts_.sockets_per_peer) {
    fail(c, c.who() + ": rank " + std::to_string(h.from_rank) + " uses " +
                std::to_string(h.sockets_per_peer) + " sockets per peer, rank " +
                std::to_string(opts_.rank) + " uses " + std::to_string(opts_.sockets_per_peer) +
                "; every rank must use the same setting",
         false, c.peer_);
    return false;
  }
  Sock& s = *c.socks_[h.socket_index < c.socks_.size() ? h.socket_index : 0];
  if (h.socket_index >= c.socks_.size() || s.phase != Sock::Phase::idle) {
    fail(c, c.who() + ": protocol error: rank " + std::to_string(h.from_rank) +
                " opened socket " + std::to_string(h.socket_index) + " twice or out of range",
         false, c.peer_);
    return false;
  }
  s.fd = fd;
  s.phase = Sock::Phase::up;
  s.readable = s.writable = true;
  s.want_out = false;
  watch_data(s);  // replaces the hello handler
  return true;
}

// ---------------------------------------------------------------------------
// Deadlines: connect retries and timeouts, hellos that never come.

void TcpTransport::service_deadlines() {
  timer_fired_ = false;
  deadlines_dirty_ = false;
  const auto now = Clock::now();
  auto next = Clock::time_point::max();
  for (TcpConnection* c : conns_) {
    if (!c->failed_ && c->setup_ == TcpConnection::Setup::lookup) {
      if (now >= c->lookup_retry_at_) start_connect(*c);
      if (!c->failed_ && c->setup_ == TcpConnection::Setup::lookup) next = std::min(next, c->lookup_retry_at_);
    }
    if (c->failed_ || c->setup_ != TcpConnection::Setup::connecting) continue;
    for (auto& sp : c->socks_) {
      if (c->failed_) break;
      Sock& s = *sp;
      if (s.phase == Sock::Phase::retry_wait) {
        if (now >= s.retry_at) {
          open_socket(*c, s);
        } else {
          next = std::min(next, s.retry_at);
        }
      }
      if (c->failed_) break;
      if (s.phase == Sock::Phase::connecting) {
        if (now >= c->deadline_) {
          fail(*c, "cannot connect to rank " + std::to_string(c->peer_) + " at " + c->addr_text_ +
                       ": no answer within " + std::to_string(opts_.connect_timeout.count()) + " ms",
               true, c->peer_);
          break;
        }
        next = std::min(next, c->deadline_);
      }
      if (s.phase == Sock::Phase::retry_wait) next = std::min(next, s.retry_at);
    }
  }
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

void TcpTransport::arm_timer(Clock::time_point when) {
  if (when == timer_armed_for_ || timer_fd_ < 0) return;
  timer_armed_for_ = when;
  itimerspec spec{};
  if (when != Clock::time_point::max()) {
    // steady_clock is CLOCK_MONOTONIC on Linux.
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(when.time_since_epoch()).count();
    spec.it_value.tv_sec = static_cast<time_t>(ns / 1000000000);
    spec.it_value.tv_nsec = static_cast<long>(ns % 1000000000);
    if (spec.it_value.tv_sec == 0 && spec.it_value.tv_nsec == 0) spec.it_value.tv_nsec = 1;
  }
  ::timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &spec, nullptr);
}

}  // namespace

// ---------------------------------------------------------------------------

std::unique_ptr<Transport> make_tcp_transport(const TcpOptions& options, Poller& poller,
                                              PeerDirectory& directory) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    throw Error(ErrorCode::InvalidUsage, "tcp transport: rank " + std::to_string(options.rank) +
                                             " is not in a world of size " + std::to_string(options.size));
  }
  if (options.sockets_per_peer < 1 || options.sockets_per_peer > kMaxSocketsPerPeer) {
    throw Error(ErrorCode::InvalidUsage, "tcp transport: sockets_per_peer must be in 1.." +
                                             std::to_string(kMaxSocketsPerPeer) + ", got " +
                                             std::to_string(options.sockets_per_peer));
  }
  if (options.auth_token.size() > wire::kMaxTokenBytes) {
    throw Error(ErrorCode::InvalidUsage, "tcp transport: the auth token is longer than " +
                                             std::to_string(wire::kMaxTokenBytes) + " bytes");
  }
  return std::make_unique<TcpTransport>(options, poller, directory);
}

namespace {

struct IfAddr {
  std::string name;
  in_addr addr{};
  in_addr mask{};
  unsigned flags = 0;
};

std::string ntop(in_addr a) {
  char ip[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a, ip, sizeof ip);
  return ip;
}

bool resolve_v4(const std::string& host, in_addr* out) {
  if (::inet_pton(AF_INET, host.c_str(), out) == 1) return true;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return false;
  *out = reinterpret_cast<const sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return true;
}

bool is_loopback(in_addr a) { return (ntohl(a.s_addr) >> 24) == 127; }

}  // namespace

std::string select_address(const std::string& ifname, const std::string& master_addr, bool prefer_external) {
  std::vector<IfAddr> list;
  ifaddrs* ifa = nullptr;
  if (::getifaddrs(&ifa) == 0) {
    for (ifaddrs* p = ifa; p != nullptr; p = p->ifa_next) {
      if (p->ifa_addr == nullptr || p->ifa_addr->sa_family != AF_INET) continue;
      IfAddr e;
      e.name = p->ifa_name;
      e.addr = reinterpret_cast<const sockaddr_in*>(p->ifa_addr)->sin_addr;
      if (p->ifa_netmask != nullptr) e.mask = reinterpret_cast<const sockaddr_in*>(p->ifa_netmask)->sin_addr;
      e.flags = p->ifa_flags;
      list.push_back(e);
    }
    ::freeifaddrs(ifa);
  } else if (!ifname.empty()) {
    throw Error(ErrorCode::System, std::string("getifaddrs: ") + errno_text(errno));
  }

  if (!ifname.empty()) {
    for (const IfAddr& e : list) {
      if (e.name == ifname) return ntop(e.addr);
    }
    std::string known;
    for (const IfAddr& e : list) known += (known.empty() ? "" : ", ") + e.name + " (" + ntop(e.addr) + ")";
    throw Error(ErrorCode::InvalidUsage, "network interface '" + ifname +
                                             "' (BRAID_SOCKET_IFNAME) has no IPv4 address; interfaces with one: " +
                                             (known.empty() ? "none" : known));
  }
  if ((master_addr.empty() && !prefer_external) || master_addr == "localhost" || master_addr == "::1")
    return "127.0.0.1";
  in_addr master{};
  if (resolve_v4(master_addr, &master)) {
    if (is_loopback(master)) return "127.0.0.1";
    for (const IfAddr& e : list) {
      if ((e.flags & IFF_UP) && !(e.flags & IFF_LOOPBACK) && e.mask.s_addr != 0 &&
          (e.addr.s_addr & e.mask.s_addr) == (master.s_addr & e.mask.s_addr)) {
        return ntop(e.addr);
      }
    }
  }
  for (const IfAddr& e : list) {
    if ((e.flags & IFF_UP) && !(e.flags & IFF_LOOPBACK) && !is_loopback(e.addr)) return ntop(e.addr);
  }
  return "127.0.0.1";
}

}  // namespace braid::transport
