// braid TCP transport.
//
// Wire protocol (all integers little-endian; layouts in tcp/wire.hpp, prose in
// docs/transport-tcp.md):
// - Each rank listens on one socket and publishes "ip:port" under key "tcp". For a
//   pair (a, b) with a < b, rank a opens sockets_per_peer sockets to b; each starts
//   with a Hello {magic "BRDH", version, socket_index, sockets_per_peer, proof
//   length, from_rank, to_rank, comm_id} and a fresh proof of the job's token bound to
//   those fields (base/auth.hpp: nonce, HMAC-SHA-256; the token never travels). b checks
//   it and refuses a nonce it has seen; anything that is not an authenticated peer of
//   this communicator is closed silently.
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
// - With TLS (BRAID_TLS=1, base/tls.hpp): the hello and the acceptor's answer travel as
//   above, in clear (they carry no secret); then both ends run a TLS 1.3 handshake with
//   certificates on that socket (the connector as client), and every part after it
//   travels inside TLS records. The connector queues nothing until its TLS is up.
// - A rank that fails sends each peer, on every socket that is between parts, a notice
//   (a part header with magic "BRDN": whom it blames, and its reason) before it closes;
//   the peer reports those words when it sees the close (Transport::tell_peers).
//
// The listener, accepted sockets waiting for their hello, the hello's authentication,
// the peer-address lookup and the set-up deadlines are the Skeleton's
// (transport/skeleton.hpp), shared with the other socket-set-up transport.
//
// Progress model: all sockets are non-blocking and edge-triggered in the Poller.
// Poller handlers only record readiness (readable / writable flags); every read,
// write, accept and connect step happens in progress(). A socket is read until
// EAGAIN, a short read, a missing receive, or a 4 MiB budget per call; likewise for
// writes, so one large transfer cannot starve the others. EPOLLOUT is registered
// only while a socket has data it could not write.
#include "transport/tcp/tcp_transport.hpp"

#include "base/logging.hpp"
#include "base/text.hpp"
#include "base/tls.hpp"
#include "transport/common.hpp"
#include "transport/skeleton.hpp"
#include "transport/tcp/ack_state.hpp"
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
  std::string hello;  ///< the connector's hello, or the acceptor's answer: sent before any part
  std::size_t hello_sent = 0;
  // The connecting side reads the acceptor's proof (its answer) before any part.
  bool answered = true;
  std::size_t answer_got = 0;
  unsigned char answer[base::auth::kProofBytes] = {};
  // TLS (opts_.tls): the session, made once the hello and the answer have passed.
  std::unique_ptr<base::tls::Session> tls;
  bool tls_wants_write = false;  // the handshake's last step waited for room to write
  // Send side.
  Fifo<SendPart> sendq;
  // Dead-peer detection (check_acks): when this socket was first seen with data
  // unacknowledged and the peer's window open, continuously since; max() when not.
  Clock::time_point unacked_since = Clock::time_point::max();
  Clock::time_point ack_checked{};  // the last check that read this socket
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
    if (failure_.failed) {
      if (why) *why = failure_.error;
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
  PeerLookup lookup_;  // finding the peer's address
  int last_errno_ = 0;

  Fifo<SendOp> sends_;
  std::uint64_t send_base_ = 0;  // seq of sends_.front()
  std::uint64_t send_next_ = 0;
  Fifo<RecvOp> recvs_;
  std::uint64_t recv_base_ = 0;
  std::uint64_t recv_next_ = 0;

  Failure failure_;
  bool eof_seen_ = false;  // some socket reached EOF between messages
  // A receive waits on a socket that reached EOF. The connection fails as "closed by
  // peer" at the end of this progress pass, not at once: with several sockets the peer's
  // last bytes may sit on another socket (a header that does not match the posted
  // receive, say), and that explanation is the better error.
  bool eof_fail_pending_ = false;
  Clock::time_point next_ack_check_{};  // TcpTransport::check_acks
};

// How long a peer may leave data unacknowledged before it is unreachable (cable, link or
// host gone): half the set-up deadline, 1 to 30 s. The connection then fails naming that
// peer, before the collective's own deadline blames whichever rank happened to be waiting.
std::chrono::milliseconds dead_peer_limit(std::chrono::milliseconds deadline) {
  return std::chrono::milliseconds(std::clamp<long long>(deadline.count() / 2, 1000, 30000));
}

// `deadline` > 0 arms dead-peer detection (docs/transport-tcp.md, "Dead peers"):
// - idle sockets: keepalive probes every quarter of the limit; three unanswered ones after
//   an idle quarter end the connection with ETIMEDOUT;
// - data in flight: TcpTransport::check_acks reads TCP_INFO.
// Not TCP_USER_TIMEOUT: Linux applies it to zero-window probing too, so it would fail a
// live peer that only posts its receive late (a rank in a long checkpoint or evaluation)
// while the collective's deadline still has time.
void tune_socket(int fd, std::size_t buffer, std::chrono::milliseconds deadline = std::chrono::milliseconds(0)) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (deadline.count() > 0) {
    const int probe_s = static_cast<int>(std::max<long long>(1, dead_peer_limit(deadline).count() / 4000));
    const int probes = 3;
    ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &probe_s, sizeof probe_s);
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &probe_s, sizeof probe_s);
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
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


bool retriable_connect_error(int err) {
  return err == ECONNREFUSED || err == ETIMEDOUT || err == ECONNABORTED || err == ECONNRESET ||
         err == EHOSTUNREACH || err == ENETUNREACH || err == EAGAIN;
}

class TcpTransport final : public Skeleton {
 public:
  TcpTransport(const TcpOptions& options, Poller& poller, PeerDirectory& directory);
  ~TcpTransport() override;

  const char* name() const noexcept override { return "tcp"; }
  /// A receive posted on a socket that already saw EOF fails in the next progress pass
  /// (eof_fail_pending_), which must come before the engine blocks.
  bool prepare_sleep() override {
    for (const TcpConnection* c : conns_.all())
      if (c->eof_fail_pending_ && !c->failure_.failed) return false;
    return true;
  }
  Connection* connection(int peer) override;
  void tell_peers(int blame, const std::string& reason) override;

  /// Fails every pending request of `c` with `msg` and closes its sockets; later
  /// requests fail with the same message.
  void fail(TcpConnection& c, const std::string& msg, bool closed, int blame);
  int nsock() const noexcept { return opts_.sockets_per_peer; }

 private:
  TcpConnection& get_conn(int peer);
  void close_socks() noexcept;
  void close_sock(Sock& s) noexcept;
  void watch_data(Sock& s);
  void set_want_out(Sock& s, bool on);
  void fail_io(TcpConnection& c, int err, const char* op);

  bool progress_connection(TcpConnection& c);
  /// Dead-peer detection while data is in flight (tune_socket): a socket whose bytes the
  /// peer's kernel has not acknowledged for dead_peer_limit() although its window is open
  /// fails the connection, naming the peer. A closed window means a live peer that has not
  /// posted its receive yet: that is the collective deadline's business.
  void check_acks(TcpConnection& c);
  std::size_t write_some(TcpConnection& c, Sock& s);
  std::size_t read_some(TcpConnection& c, Sock& s);
  /// The connector reads the acceptor's answer (in clear) and checks it; false until it
  /// has, or when it failed the connection.
  bool read_answer(TcpConnection& c, Sock& s, std::size_t* total);
  /// With TLS: whether `s` is ready for parts: its hello or answer written, the answer
  /// checked, the TLS handshake done (advancing each as far as readiness allows). Without
  /// TLS: true. `moved` is set when a byte moved.
  bool tls_ready(TcpConnection& c, Sock& s, bool* moved);
  /// writev/readv on the socket, through TLS once it is up.
  ssize_t sock_writev(Sock& s, iovec* iov, int n);
  ssize_t sock_readv(Sock& s, iovec* iov, int n);
  /// What a recv or readv on `s` that returned `r` means to read_some's loop: bytes
  /// arrived, try again (EINTR), the socket is drained (readable cleared), or the
  /// connection ended (EOF or an error, already reported through on_eof or fail_io).
  enum class ReadOutcome { got, retry, drained, ended };
  ReadOutcome read_outcome(TcpConnection& c, Sock& s, ssize_t r, bool eof_at_boundary);
  bool match_part(TcpConnection& c, Sock& s, const RecvPart& p, RecvOp& op);
  void on_eof(TcpConnection& c, Sock& s, bool at_boundary);
  bool complete(TcpConnection& c);

  void start_connect(TcpConnection& c);
  void open_socket(TcpConnection& c, Sock& s);
  void finish_connect(TcpConnection& c, Sock& s);
  void connect_failed(TcpConnection& c, Sock& s, int err);
  void on_connected(TcpConnection& c, Sock& s);

  // Skeleton.
  void on_accept(int fd) override;
  bool adopt(PendingAccept& pa) override;
  std::string refusal(const PendingAccept& pa, bool valid) const override;
  bool progress_connections() override;
  Clock::time_point connection_deadlines(Clock::time_point now) override;
  void fail_connections(const std::string& reason) override;

  TcpOptions opts_;
  std::string listen_text_;
  ConnectionTable<TcpConnection> conns_;
};

// ---------------------------------------------------------------------------
// Posting.

void TcpConnection::send(const void* buf, std::size_t bytes, std::uint64_t tag, Request* req) {
  check_post("tcp", "send", buf, bytes, req, peer_);
  start_request(req);
  if (eof_seen_ && !failure_.failed) t_.fail(*this, who() + " closed by peer", true, peer_);
  if (failure_.failed) {
    failure_.apply(req);
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
  if (eof_seen_ && !failure_.failed) {
    for (int i = 0; i < parts; ++i) {
      if (socks_[static_cast<std::size_t>(wire::part_socket(seq, i, sockets))]->eof) {
        eof_fail_pending_ = true;  // failed by the next progress pass (see the member)
        break;
      }
    }
  }
  if (failure_.failed) {
    failure_.apply(req);
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
    : Skeleton(options, poller, directory, "tcp", {wire::kHelloMagic, wire::kHelloBytes, &wire::hello_tail}),
      opts_(options),
      conns_(options.size) {
  // With no master address known (a communicator over a store the caller made, as the torch
  // backend's over torch's), an interface other hosts can reach, not loopback: its ranks may
  // be on other hosts (srun --mpi=pmix), and loopback there is their own.
  const std::string ip = select_address(opts_.ifname, opts_.master_addr, true);
  const std::string where =
      !opts_.ifname.empty() ? "interface " + opts_.ifname + " (" + ip + ")" : ip;
  base::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) throw Error(ErrorCode::Network, self() + ": socket() failed: " + errno_text(errno));
  // Set before listen() so that accepted sockets inherit them with window scaling.
  tune_socket(fd.get(), opts_.socket_buffer);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 || ::listen(fd.get(), SOMAXCONN) != 0) {
    throw Error(ErrorCode::Network, self() + ": cannot listen on " + where + ": " + errno_text(errno) +
                                        "; set BRAID_SOCKET_IFNAME to a usable interface");
  }
  socklen_t len = sizeof a;
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len);
  listen_text_ = sockaddr_text(a);
  serve(std::move(fd));
  directory_.publish("tcp", listen_text_);
}

TcpTransport::~TcpTransport() {
  // Requests may already be gone; only the fds are released here (close_all fails
  // pending requests and is what an orderly shutdown calls first).
  close_socks();
}

void TcpTransport::close_socks() noexcept {
  for (TcpConnection* c : conns_.all()) {
    for (auto& s : c->socks_) close_sock(*s);
  }
}

void TcpTransport::close_sock(Sock& s) noexcept {
  s.tls.reset();  // it does not own the descriptor
  if (s.fd >= 0) {
    poller_.unwatch(s.fd);
    ::close(s.fd);
    s.fd = -1;
  }
  s.phase = Sock::Phase::closed;
  s.readable = s.writable = s.want_out = false;
}

TcpConnection& TcpTransport::get_conn(int peer) {
  bool fresh = false;
  TcpConnection& c = conns_.get(
      peer, [&] { return std::make_unique<TcpConnection>(*this, peer, opts_.rank, opts_.sockets_per_peer); }, &fresh);
  if (fresh && closed()) {
    c.failure_.set(closed_reason(), false, -1);
    for (auto& s : c.socks_) s->phase = Sock::Phase::closed;
  }
  return c;
}

Connection* TcpTransport::connection(int peer) {
  check_peer(peer);
  TcpConnection& c = get_conn(peer);
  if (c.connector_ && c.setup_ == TcpConnection::Setup::idle && !c.failure_.failed) {
    c.setup_ = TcpConnection::Setup::wanted;  // connect on the next progress()
  }
  return &c;
}

void TcpTransport::fail(TcpConnection& c, const std::string& msg, bool closed, int blame) {
  if (c.failure_.failed) return;
  complete(c);  // requests whose bytes all moved are done, whatever comes after them
  c.failure_.set(msg, closed, blame);
  c.setup_ = TcpConnection::Setup::done;
  for (auto& s : c.socks_) {
    close_sock(*s);
    s->sendq.clear();
    s->recvq.clear();
  }
  c.failure_.apply_all(c.sends_);
  c.failure_.apply_all(c.recvs_);
  changed();
}

void TcpTransport::fail_connections(const std::string& reason) {
  for (TcpConnection* c : conns_.all()) fail(*c, reason, false, -1);
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

bool TcpTransport::progress_connections() {
  return conns_.step_all([this](TcpConnection& c) { return progress_connection(c); });
}

bool TcpTransport::progress_connection(TcpConnection& c) {
  if (c.failure_.failed) return false;
  if (c.setup_ == TcpConnection::Setup::wanted) start_connect(c);
  bool moved = false;
  for (auto& sp : c.socks_) {
    if (c.failure_.failed) break;
    Sock& s = *sp;
    if (s.phase == Sock::Phase::connecting && s.writable) finish_connect(c, s);
    if (s.phase != Sock::Phase::up) continue;
    if (!tls_ready(c, s, &moved)) continue;
    if (!s.sendq.empty() || s.hello_sent < s.hello.size()) {
      if (s.writable && write_some(c, s) > 0) moved = true;
    } else if (s.want_out) {
      set_want_out(s, false);
    }
    if (c.failure_.failed) break;
    // A header already read (e.g. with the previous payload) needs no readiness.
    if ((s.readable || s.hdr_got == kHeader) && read_some(c, s) > 0) moved = true;
  }
  if (!c.failure_.failed && c.eof_fail_pending_) {
    fail(c, c.who() + " closed by peer", true, c.peer_);
    return true;
  }
  if (!c.failure_.failed && (!c.sends_.empty() || !c.recvs_.empty())) check_acks(c);
  if (!c.failure_.failed && complete(c)) moved = true;
  return moved;
}

std::size_t TcpTransport::write_some(TcpConnection& c, Sock& s) {
  std::size_t total = 0;
  iovec iov[kMaxIov];
  // With TLS, parts go only through the session (the hello before it, in clear).
  const bool parts = !opts_.tls || (s.tls && s.tls->established());
  while (total < kIoBudget) {
    const std::size_t budget = kIoBudget - total;
    int n = 0;
    std::size_t want = 0;
    if (s.hello_sent < s.hello.size()) {
      iov[n++] = {&s.hello[s.hello_sent], s.hello.size() - s.hello_sent};
      want += s.hello.size() - s.hello_sent;
    }
    for (std::size_t i = 0; parts && i < s.sendq.size() && n + 2 <= kMaxIov && want < budget; ++i) {
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
    const ssize_t r = sock_writev(s, iov, n);
    if (r < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        s.writable = false;
        set_want_out(s, true);
        break;
      }
      if (err == EPROTO && s.tls) {
        fail(c, c.who() + ": TLS failed on socket " + std::to_string(s.index) + ": " + s.tls->error(), false,
             c.peer_);
      } else {
        fail_io(c, err, "send");
      }
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
  if (s.sendq.empty() && s.hello_sent == s.hello.size() && s.want_out && !s.tls_wants_write) set_want_out(s, false);
  return total;
}

ssize_t TcpTransport::sock_writev(Sock& s, iovec* iov, int n) {
  if (s.tls) return s.tls->writev(iov, n);
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = static_cast<std::size_t>(n);
  return ::sendmsg(s.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

ssize_t TcpTransport::sock_readv(Sock& s, iovec* iov, int n) {
  if (s.tls) return s.tls->readv(iov, n);
  return ::readv(s.fd, iov, n);
}

bool TcpTransport::read_answer(TcpConnection& c, Sock& s, std::size_t* total) {
  while (!s.answered) {
    // The acceptor's answer: a proof of the token bound to our hello. Nothing it sends is
    // read before it holds, so a program in the peer's place cannot inject data.
    if (s.answer_got < sizeof s.answer) {
      if (!s.readable) return false;
      const ssize_t r = ::recv(s.fd, s.answer + s.answer_got, sizeof s.answer - s.answer_got, 0);
      const ReadOutcome o = read_outcome(c, s, r, false);
      if (o == ReadOutcome::retry) continue;
      if (o != ReadOutcome::got) return false;
      s.answer_got += static_cast<std::size_t>(r);
      *total += static_cast<std::size_t>(r);
      if (s.answer_got < sizeof s.answer && !s.hup) s.readable = false;
      continue;
    }
    if (!base::auth::verify(opts_.auth_token, wire::answer_context(s.hello), s.answer, sizeof s.answer)) {
      fail(c, c.who() + ": the end of socket " + std::to_string(s.index) + " at " + c.addr_text_ +
                  " could not prove it knows the job's token: not rank " + std::to_string(c.peer_) +
                  " of this job (another program in its place?)",
           false, c.peer_);
      return false;
    }
    s.answered = true;
  }
  return true;
}

bool TcpTransport::tls_ready(TcpConnection& c, Sock& s, bool* moved) {
  if (!opts_.tls || (s.tls && s.tls->established())) return true;
  if (!s.tls) {
    // First the hello (connector) or the answer (acceptor), in clear...
    if (s.hello_sent < s.hello.size()) {
      if (s.writable && write_some(c, s) > 0) *moved = true;
      if (c.failure_.failed || s.hello_sent < s.hello.size()) return false;
    }
    // ...and the connector checks the answer before it trusts the socket with TLS.
    std::size_t got = 0;
    const bool answered = read_answer(c, s, &got);
    if (got > 0) *moved = true;
    if (!answered) return false;
    try {
      s.tls = std::make_unique<base::tls::Session>(*opts_.tls, s.fd, !c.connector_);
    } catch (const std::exception& e) {
      fail(c, c.who() + ": " + e.what(), false, -1);
      return false;
    }
    s.readable = s.writable = true;  // the first step sends or reads what it can
  } else if (!(s.tls_wants_write ? s.writable : s.readable)) {
    return false;  // waiting for the readiness the last step asked for
  }
  const base::tls::Session::Step step = s.tls->handshake();
  *moved = true;
  switch (step) {
    case base::tls::Session::Step::done:
      s.tls_wants_write = false;
      s.readable = true;  // the peer's first records may already be here
      if (s.index == 0) BRAID_LOG(info, c.who() + ": TLS up: " + s.tls->describe());
      return true;
    case base::tls::Session::Step::want_read:
      s.tls_wants_write = false;
      s.readable = false;
      return false;
    case base::tls::Session::Step::want_write:
      s.tls_wants_write = true;
      s.writable = false;
      set_want_out(s, true);
      return false;
    case base::tls::Session::Step::failed: {
      const std::string& why = s.tls->error();
      const bool plain = why.find("wrong version number") != std::string::npos;
      fail(c, c.who() + ": the TLS handshake on socket " + std::to_string(s.index) + (c.connector_ ? " to " : " from ") +
                  (c.addr_text_.empty() ? std::string("the peer") : c.addr_text_) + " failed: " +
                  (plain ? "rank " + std::to_string(c.peer_) + " does not speak TLS (" + why +
                               "): set BRAID_TLS=1 on every rank, or on none"
                         : why + " (BRAID_TLS, BRAID_TLS_CERT and BRAID_TLS_CA must fit on every rank)"),
           false, c.peer_);
      return false;
    }
  }
  return false;
}

std::size_t TcpTransport::read_some(TcpConnection& c, Sock& s) {
  std::size_t total = 0;
  if (!read_answer(c, s, &total)) return total;
  while (total < kIoBudget) {
    if (s.hdr_got < kHeader) {
      if (!s.readable) break;
      iovec h{s.hdr + s.hdr_got, kHeader - s.hdr_got};
      const ssize_t r = sock_readv(s, &h, 1);
      const ReadOutcome o = read_outcome(c, s, r, s.hdr_got == 0);
      if (o == ReadOutcome::retry) continue;
      if (o == ReadOutcome::drained) break;
      if (o == ReadOutcome::ended) return total;
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
      if (wire::notice_header_valid(s.cur, kMaxNoticeBytes)) {
        // The peer failed and says why before closing: read its reason, then treat this
        // socket as at its end (the close follows; the failure it causes carries the words).
        std::string notice(s.cur.part_bytes, '\0');
        std::size_t got = 0;
        while (got < notice.size()) {
          iovec v{&notice[got], notice.size() - got};
          const ssize_t r = sock_readv(s, &v, 1);
          if (r > 0) {
            got += static_cast<std::size_t>(r);
            continue;
          }
          if (r < 0 && errno == EINTR) continue;
          break;  // the close (or an error) comes next; the notice stays unread in part
        }
        if (got == notice.size()) {
          const auto blamed = static_cast<std::int64_t>(s.cur.tag);
          c.failure_.note(c.peer_, blamed >= 0 && blamed < opts_.size ? static_cast<int>(blamed) : -1, notice);
        }
        on_eof(c, s, true);
        return total;
      }
      if (!wire::part_header_valid(s.cur)) {
        if (!s.tls && s.hdr[0] == 22 && s.hdr[1] == 3) {  // a TLS handshake record
          fail(c, c.who() + ": rank " + std::to_string(c.peer_) + " speaks TLS on socket " + std::to_string(s.index) +
                      " and this rank does not: set BRAID_TLS=1 (with its certificate) on every rank, or on none",
               false, c.peer_);
          return total;
        }
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
      const ssize_t r = sock_readv(s, iov, take == rest ? 2 : 1);
      const ReadOutcome o = read_outcome(c, s, r, false);
      if (o == ReadOutcome::retry) continue;
      if (o == ReadOutcome::drained) break;
      if (o == ReadOutcome::ended) return total;
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

void TcpTransport::check_acks(TcpConnection& c) {
  const auto now = Clock::now();
  if (now < c.next_ack_check_) return;
  const auto limit = dead_peer_limit(opts_.connect_timeout);
  const auto period = std::max<std::chrono::milliseconds>(limit / 4, std::chrono::milliseconds(250));
  c.next_ack_check_ = now + period;
  for (auto& sp : c.socks_) {
    if (sp->phase != Sock::Phase::up || sp->fd < 0) continue;
    tcp::AckState a;
    if (!tcp::read_ack_state(sp->fd, &a)) return;  // the kernel does not say: keepalive and deadlines only
    // The last ACK's age alone is not enough: on a connection idle for longer than the
    // limit, a message just sent is unacknowledged for the moment its ACK takes, while the
    // last ACK is old (a flake: a live rank declared unreachable 1 s into a wait). So the
    // data must also have been unacknowledged at every check for the whole limit. Data
    // first seen unacknowledged was sent after the previous check (which saw none) and
    // not before the last ACK; checks run only while requests are pending, so after a
    // pause longer than the limit it counts from now.
    const bool continuous = sp->ack_checked != Clock::time_point{} && now - sp->ack_checked <= limit;
    const auto previous = sp->ack_checked;
    sp->ack_checked = now;
    if (!a.in_flight || !a.window_open) {
      sp->unacked_since = Clock::time_point::max();
      continue;
    }
    if (!continuous)
      sp->unacked_since = now;
    else if (sp->unacked_since == Clock::time_point::max())
      sp->unacked_since = std::max(previous, now - std::chrono::milliseconds(a.ms_since_ack));
    if (now - sp->unacked_since >= limit && a.ms_since_ack > static_cast<std::uint32_t>(limit.count())) {
      fail(c, c.who() + " is unreachable: no TCP acknowledgement for " + std::to_string(a.ms_since_ack) +
                  " ms with data in flight on socket " + std::to_string(sp->index) + " (link, network or host down)",
           false, c.peer_);
      return;
    }
  }
}

TcpTransport::ReadOutcome TcpTransport::read_outcome(TcpConnection& c, Sock& s, ssize_t r, bool eof_at_boundary) {
  if (r > 0) return ReadOutcome::got;
  if (r == 0) {
    on_eof(c, s, eof_at_boundary);
    return ReadOutcome::ended;
  }
  const int err = errno;
  if (err == EINTR) return ReadOutcome::retry;
  if (err == EAGAIN || err == EWOULDBLOCK) {
    s.readable = false;
    return ReadOutcome::drained;
  }
  if (err == EPROTO && s.tls) {
    fail(c, c.who() + ": TLS failed on socket " + std::to_string(s.index) + ": " + s.tls->error() +
                " (a record that does not authenticate: altered on the way, or not from the peer)",
         false, c.peer_);
  } else {
    fail_io(c, err, "recv");
  }
  return ReadOutcome::ended;
}

bool TcpTransport::match_part(TcpConnection& c, Sock& s, const RecvPart& p, RecvOp& op) {
  const wire::PartHeader& h = s.cur;
  const wire::PartMatch m = wire::match_part(h, p.seq, p.index, op.tag, op.bytes, p.len);
  if (m == wire::PartMatch::wrong_part) {
    fail(c, c.who() + ": protocol error on socket " + std::to_string(s.index) +
                ": expected message #" + std::to_string(p.seq) + " part " + std::to_string(p.index) +
                ", got message #" + std::to_string(h.seq) + " part " + std::to_string(h.part_index),
         false, c.peer_);
    return false;
  }
  if (m == wire::PartMatch::wrong_message) {
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
  if (m == wire::PartMatch::wrong_length) {
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
  if (!c.sends_.empty()) {
    fail(c, c.who() + " closed by peer", true, c.peer_);
  } else if (!s.recvq.empty()) {
    c.eof_fail_pending_ = true;  // after the other sockets are read (see the member)
  }
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

void TcpTransport::tell_peers(int blame, const std::string& reason) {
  const std::string why = reason.substr(0, kMaxNoticeBytes);
  wire::PartHeader h;
  h.magic = wire::kNoticeMagic;
  h.tag = static_cast<std::uint64_t>(static_cast<std::int64_t>(blame));
  h.msg_bytes = h.part_bytes = why.size();
  unsigned char head[kHeader];
  wire::encode(h, head);
  for (TcpConnection* c : conns_.all()) {
    if (c->failure_.failed) continue;
    for (auto& sp : c->socks_) {
      Sock& s = *sp;
      // Only between parts, after the hello (and TLS), so that the peer reads it as a header.
      if (s.phase != Sock::Phase::up || s.fd < 0 || s.hello_sent < s.hello.size()) continue;
      if (opts_.tls && !(s.tls && s.tls->established())) continue;
      if (!s.sendq.empty() && s.sendq.front().sent > 0) continue;
      iovec iov[2] = {{head, kHeader}, {const_cast<char*>(why.data()), why.size()}};
      (void)sock_writev(s, iov, 2);  // never waits: a full socket gets only the close
    }
  }
}

// ---------------------------------------------------------------------------
// Connecting (the lower rank of a pair).

void TcpTransport::start_connect(TcpConnection& c) {
  // The peer's address comes from the store (PeerLookup: never blocks).
  const bool first = c.setup_ == TcpConnection::Setup::wanted;
  c.setup_ = TcpConnection::Setup::lookup;
  std::string error;
  const std::optional<std::string> found =
      look_up(c.lookup_, first, c.peer_, "tcp", "its TCP address", "has it started?", &error);
  if (!found) {
    if (!error.empty()) fail(c, "cannot connect to rank " + std::to_string(c.peer_) + ": " + error, false, c.peer_);
    return;
  }
  const std::string& value = *found;
  c.setup_ = TcpConnection::Setup::connecting;
  if (!wire::parse_addr(value, &c.addr_)) {
    fail(c, "cannot connect to rank " + std::to_string(c.peer_) + ": it published the TCP address '" +
                value.substr(0, 80) + "', expected ip:port",
         false, c.peer_);
    return;
  }
  c.addr_text_ = sockaddr_text(c.addr_);
  c.deadline_ = Clock::now() + opts_.connect_timeout;
  for (auto& s : c.socks_) {
    if (c.failure_.failed) break;
    open_socket(c, *s);
  }
  deadlines_changed();
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
  deadlines_changed();
}

void TcpTransport::on_connected(TcpConnection& c, Sock& s) {
  s.phase = Sock::Phase::up;
  s.readable = s.writable = true;
  s.want_out = true;  // until the hello and anything queued are written
  wire::Hello h;
  h.socket_index = static_cast<std::uint16_t>(s.index);
  h.sockets_per_peer = static_cast<std::uint16_t>(opts_.sockets_per_peer);
  h.token_bytes = static_cast<std::uint16_t>(base::auth::kProofBytes);
  h.from_rank = opts_.rank;
  h.to_rank = c.peer_;
  h.comm_id = opts_.comm_id;
  const std::string fixed = wire::hello_bytes(h, "");
  s.hello = fixed + hello_proof(opts_.auth_token, fixed);
  s.answered = false;
  s.answer_got = 0;
  s.hello_sent = 0;
  watch_data(s);
  bool all_up = true;
  for (auto& o : c.socks_) all_up = all_up && o->phase == Sock::Phase::up;
  if (all_up) c.setup_ = TcpConnection::Setup::done;
}

// ---------------------------------------------------------------------------
// Accepting (the higher rank of a pair).

void TcpTransport::on_accept(int fd) { tune_socket(fd, 0, opts_.connect_timeout); }

std::string TcpTransport::refusal(const PendingAccept& pa, bool valid) const {
  sockaddr_in from{};
  socklen_t len = sizeof from;
  const bool known = ::getpeername(pa.fd.get(), reinterpret_cast<sockaddr*>(&from), &len) == 0;
  return "refused an incoming connection" + (known ? " from " + sockaddr_text(from) : std::string()) +
         (valid ? ": its hello names another communicator, rank or token" : ": not a braid hello of this version");
}

bool TcpTransport::adopt(PendingAccept& pa) {
  const wire::Hello h = wire::decode_hello(pa.buf.data());
  if (!authentic({h.comm_id, h.from_rank, h.to_rank, pa.buf.data() + wire::kHelloBytes, h.token_bytes, pa.buf.data(),
                   wire::kHelloBytes}))
    return false;
  const int fd = pa.fd.get();
  TcpConnection& c = get_conn(h.from_rank);
  if (c.failure_.failed) return false;
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
  s.fd = pa.fd.release();
  s.phase = Sock::Phase::up;
  s.readable = s.writable = true;
  s.want_out = false;
  // Our answer, before any part: a proof of the token bound to the connector's hello, so
  // that it knows it reached a rank of this job (mutual authentication).
  s.hello = hello_proof(opts_.auth_token, wire::answer_context(std::string(
                                               reinterpret_cast<const char*>(pa.buf.data()), pa.buf.size())));
  s.hello_sent = 0;
  s.answered = true;
  watch_data(s);  // replaces the hello handler
  return true;
}

// ---------------------------------------------------------------------------
// Deadlines: connect retries and timeouts (the skeleton adds hellos that never come).

Clock::time_point TcpTransport::connection_deadlines(Clock::time_point now) {
  auto next = Clock::time_point::max();
  for (TcpConnection* c : conns_.all()) {
    if (!c->failure_.failed && c->setup_ == TcpConnection::Setup::lookup) {
      if (now >= c->lookup_.retry_at) start_connect(*c);
      if (!c->failure_.failed && c->setup_ == TcpConnection::Setup::lookup) next = std::min(next, c->lookup_.retry_at);
    }
    if (c->failure_.failed || c->setup_ != TcpConnection::Setup::connecting) continue;
    for (auto& sp : c->socks_) {
      if (c->failure_.failed) break;
      Sock& s = *sp;
      if (s.phase == Sock::Phase::retry_wait) {
        if (now >= s.retry_at) {
          open_socket(*c, s);
        } else {
          next = std::min(next, s.retry_at);
        }
      }
      if (c->failure_.failed) break;
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
  return next;
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

}  // namespace braid::transport
