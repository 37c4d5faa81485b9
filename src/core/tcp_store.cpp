// braid — TcpStore: an in-memory key-value map behind a TCP socket.
//
// Protocol (every integer little-endian; every length from the wire is untrusted):
//   hello    client -> server: u32 magic "BRDS", u16 version (3), u16 flags (1: the client
//            has a token), a 16-byte random nonce Nc. A wrong magic or version is closed
//            without an answer. The server answers magic, version, u16:
//            0 accepted (a server without a token: it serves anyone, and a client that
//              has a token refuses to use it, since it cannot tell it from a squatter);
//            1 refused (the client has no token and the server has one), then closes;
//            2 challenge, then its nonce Ns and HMAC-SHA-256(token, "braid store
//              server\n" Nc Ns). The client checks that proof (a server that cannot give it
//              is refused: the client never reveals anything a squatter could use), then
//              sends HMAC-SHA-256(token, "braid store client\n" Nc Ns); the server answers
//              accepted or refused (logged at WARN, then closed). The token never travels,
//              and fresh nonces on both sides make a recorded handshake worthless.
//            Until its handshake is done a connection may send nothing else; one that
//            has not finished it within BRAID_STORE_HELLO_TIMEOUT is closed, and beyond
//            BRAID_STORE_MAX_PENDING such connections a newer one is refused at once.
//   TLS      with BRAID_TLS=1 (base/tls.hpp) every connection is a TLS 1.3 session with
//            certificates both ways, and everything above travels inside it; the hello
//            deadline and the pending cap cover the TLS handshake too. A server with TLS
//            answers a client whose first bytes are a plaintext hello with the one
//            plaintext answer 3 (TLS required), then closes, so that client can say why.
//   frame    u32 body length (1 .. kMaxFrame), then the body.
//   request  u8 op, u32 id, fields; a string is u32 length + bytes (key <= 4 KiB,
//            value <= 64 MiB): SET key value | GET key u64 timeout_ms |
//            ADD key i64 delta | CHECK u32 n, n keys | WAIT u32 n, n keys, u64 timeout_ms |
//            REMOVE key.
//   reply    u8 status (OK, TIMEOUT, ERROR), u32 id of the request, payload:
//            GET value | ADD i64 | CHECK, REMOVE u8 | WAIT on TIMEOUT: u32 n, missing keys |
//            ERROR: message.
//
// The server is one thread around a base::Poller (epoll). GET and WAIT never block it: a request
// whose keys are missing is parked on each key and answered when a SET/ADD
// completes it, or with TIMEOUT when its deadline (kept by the server) passes. So
// replies may come out of request order; the id pairs them up. A connection that
// sends anything malformed is closed; the others are unaffected.
//
// The client has no thread. Callers share the socket: sends are serialised, and
// whichever caller is waiting reads replies for everyone (leader/follower) and
// hands them out by id. A broken connection fails every pending and later call with
// Error(Network); a server that stops answering fails them with TimeoutError at the
// caller's deadline (plus a grace period for GET/WAIT, whose timeout the server owns).
#include <braid/error.hpp>
#include <braid/store.hpp>

#include "base/fd.hpp"
#include "base/logging.hpp"
#include "base/poller.hpp"
#include "base/text.hpp"
#include "base/tls.hpp"
#include "core/config.hpp"
#include "core/store_limits.hpp"
#include "core/store_tls.hpp"
#include "core/store_wire.hpp"
#include "transport/interfaces.hpp"
#include "transport/common.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <deque>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace braid {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The byte format (constants, encoder, decoders): core/store_wire.hpp.
using namespace core::store_wire;  // NOLINT: this file is the protocol's one user

constexpr std::uint64_t kMaxTimeoutMs = 10ull * 365 * 24 * 3600 * 1000;  // "forever"
constexpr milliseconds kReplyGrace{5000};  // server-owned timeouts: how late a reply may be
constexpr milliseconds kMinIoTimeout{30000};

// ---------------------------------------------------------------------------
// Small helpers.

using base::errno_text;
using base::quote;
using base::quote_keys;
using Fd = base::UniqueFd;

std::uint64_t clamp_timeout(milliseconds t) {
  if (t.count() <= 0) return 0;
  return std::min<std::uint64_t>(static_cast<std::uint64_t>(t.count()), kMaxTimeoutMs);
}

int ms_until(Clock::time_point deadline) {
  auto now = Clock::now();
  if (deadline <= now) return 0;
  auto ms = std::chrono::ceil<milliseconds>(deadline - now).count();
  return static_cast<int>(std::min<long long>(ms, std::numeric_limits<int>::max()));
}

using base::parse_int64;

/// Resolves an IPv4 address ("0.0.0.0", "127.0.0.1", a host name).
bool resolve_ipv4(const std::string& host, std::uint16_t port, bool passive, sockaddr_in* out,
                  std::string* err) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    *err = std::string("cannot resolve host: ") +
           (rc == EAI_SYSTEM ? errno_text(errno) : gai_strerror(rc));
    return false;
  }
  std::memcpy(out, res->ai_addr, sizeof(sockaddr_in));
  ::freeaddrinfo(res);
  return true;
}

}  // namespace

namespace core {
namespace {

/// Where a store hosted for clients that are told `host` listens (BRAID_STORE_BIND's help).
std::string store_bind_addresses(const std::string& host) {
  const base::Settings& settings = Config::global().settings;
  if (const std::string& given = settings.text("BRAID_STORE_BIND"); !given.empty()) return given;
  if (host.empty()) return "127.0.0.1";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr)
    throw Error(ErrorCode::Network, "store: cannot resolve the master address " + quote(host) + " to listen on: " +
                                        (rc == EAI_SYSTEM ? errno_text(errno) : gai_strerror(rc)) +
                                        " (or set BRAID_STORE_BIND)");
  std::vector<std::string> out;
  bool loopback = false;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const auto* sa = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
    char ip[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &sa->sin_addr, ip, sizeof ip);
    if (std::find(out.begin(), out.end(), ip) == out.end()) out.emplace_back(ip);
    loopback |= (ntohl(sa->sin_addr.s_addr) >> 24) == 127;
  }
  ::freeaddrinfo(res);
  // A host name that resolves to loopback here (Debian's /etc/hosts maps it to 127.0.1.1)
  // resolves to the host's network address on the other hosts: listen there too.
  in_addr literal{};
  const bool names_loopback = host == "localhost" || (::inet_pton(AF_INET, host.c_str(), &literal) == 1);
  if (loopback && !names_loopback) {
    const std::string ext = transport::select_address(settings.text("BRAID_SOCKET_IFNAME"), "", true);
    if (std::find(out.begin(), out.end(), ext) == out.end()) out.push_back(ext);
  }
  std::string list;
  for (const std::string& a : out) list += (list.empty() ? "" : ",") + a;
  return list;
}

}  // namespace
}  // namespace core

// ===========================================================================
// Server.

struct TcpStoreServer::Impl {
  Impl(const std::string& bind_addr, std::uint16_t port, std::string token,
       std::shared_ptr<const base::tls::Context> tls);
  ~Impl();

  std::string addr;  // "bind_addr:port" for messages
  const std::string token;  // what a client must present ("" = any)
  const std::shared_ptr<const base::tls::Context> tls;  // null: plain TCP
  std::uint16_t port = 0;
  std::vector<Fd> listeners;  // one per address it listens on
  base::Poller poller;
  std::atomic<bool> stopping{false};
  std::thread thread;

  // --- Everything below belongs to the server thread. ---
  // A connection's handshake: (with TLS) TLS's, its hello, then (with a token) its proof,
  // then requests.
  enum class Stage { tls, hello, proof, ready };
  struct Conn {
    Fd fd;
    std::unique_ptr<base::tls::Session> session;  // with TLS, from the client's first byte
    Stage stage = Stage::hello;
    std::string client_nonce, server_nonce;
    bool dead = false;
    bool want_write = false;
    std::string in;
    std::size_t in_off = 0;
    std::string out;
    std::size_t out_off = 0;
    std::unordered_set<std::uint64_t> parked;
  };
  struct Waiter {
    std::uint64_t conn;
    std::uint32_t req;
    bool is_get;
    std::vector<std::string> keys;
    Clock::time_point deadline;
  };
  std::uint64_t next_conn = 1, next_waiter = 1;
  std::unordered_map<std::uint64_t, Conn> conns;
  std::vector<std::uint64_t> closing;
  std::unordered_map<std::string, std::string> data;
  std::unordered_map<std::uint64_t, Waiter> waiters;
  std::unordered_map<std::string, std::unordered_set<std::uint64_t>> waiting_on;
  std::set<std::pair<Clock::time_point, std::uint64_t>> deadlines;
  bool accept_paused = false;  // out of file descriptors: stop accepting for a moment
  Clock::time_point accept_resume;
  // Limits (configuration rows BRAID_STORE_*, read when the server starts).
  milliseconds hello_timeout{};
  std::size_t max_pending = 0, max_keys = 0, max_bytes = 0, max_waits = 0, max_queued = 0;
  std::size_t unauthenticated = 0;  // connections still in their handshake
  std::size_t refused_newcomers = 0;
  std::size_t stored_bytes = 0;     // keys and values in `data`
  std::deque<std::pair<Clock::time_point, std::uint64_t>> hellos;  // handshake deadlines, in accept order
  // TLS connections that stopped reading at the round limit: plaintext may wait inside the
  // session, where epoll cannot see it, so they are read again without waiting.
  std::vector<std::uint64_t> read_again;

  void run() noexcept;
  void accept_all(int listen_fd);
  void set_accepting(bool on);
  void on_conn(std::uint64_t id, std::uint32_t events);
  /// Advances connection `id`'s TLS handshake; true once it is done.
  bool tls_step(std::uint64_t id, Conn& c);
  /// Watches for writability too (`out`) or not; false when the connection was dropped.
  bool watch_out(std::uint64_t id, Conn& c, bool out);
  ssize_t conn_read(Conn& c, char* buf, std::size_t n) {
    return c.session ? c.session->read(buf, n) : ::recv(c.fd.get(), buf, n, 0);
  }
  ssize_t conn_write(Conn& c, const char* bytes, std::size_t n) {
    return c.session ? c.session->write(bytes, n) : ::send(c.fd.get(), bytes, n, MSG_NOSIGNAL);
  }
  /// Why a read or write failed with `e` ("recv failed: ...", or TLS's reason).
  std::string io_failure(const Conn& c, const char* call, int e) const {
    if (c.session && e == EPROTO) return "TLS: " + c.session->error();
    return std::string(call) + " failed: " + errno_text(e);
  }
  /// Watches connection `id`'s socket for `events`; throws Error(System).
  void watch_conn(std::uint64_t id, int fd, std::uint32_t events) {
    poller.watch(fd, events, [this, id](std::uint32_t ready) { on_conn(id, ready); });
  }
  void process_input(std::uint64_t id, Conn& c);
  bool handle(std::uint64_t id, Conn& c, const char* p, std::size_t n);
  void send(std::uint64_t id, Conn& c, std::string frame);
  void flush(std::uint64_t id, Conn& c);
  void drop(std::uint64_t id, Conn& c, const std::string& why);
  void close_conn(std::uint64_t id);
  void park(std::uint64_t id, Conn& c, std::uint32_t req, bool is_get,
            std::vector<std::string> keys, std::uint64_t timeout_ms);
  void finish_waiter(std::uint64_t wid, Status status);
  void notify(const std::string& key);
  void expire();
  /// Why storing `value` under `key` would pass a limit, or "".
  std::string over_limit(const std::string& key, std::size_t value_bytes) const;
  void store_value(const std::string& key, std::string value) {
    auto it = data.find(key);
    if (it != data.end()) {
      stored_bytes -= it->first.size() + it->second.size();
      it->second = std::move(value);
      stored_bytes += key.size() + it->second.size();
    } else {
      stored_bytes += key.size() + value.size();
      data.emplace(key, std::move(value));
    }
  }
  bool has_all(const std::vector<std::string>& keys) const {
    for (const auto& k : keys)
      if (!data.count(k)) return false;
    return true;
  }
};

TcpStoreServer::Impl::Impl(const std::string& bind_addr, std::uint16_t want_port, std::string token_,
                           std::shared_ptr<const base::tls::Context> tls_)
    : token(std::move(token_)), tls(std::move(tls_)) {
  const base::Settings& settings = core::Config::global().settings;
  hello_timeout = settings.duration("BRAID_STORE_HELLO_TIMEOUT");
  max_pending = static_cast<std::size_t>(settings.integer("BRAID_STORE_MAX_PENDING").value_or(64));
  max_keys = static_cast<std::size_t>(settings.integer("BRAID_STORE_MAX_KEYS").value_or(1000000));
  max_bytes = settings.bytes("BRAID_STORE_MAX_BYTES");
  max_waits = static_cast<std::size_t>(settings.integer("BRAID_STORE_MAX_WAITS").value_or(65536));
  max_queued = settings.bytes("BRAID_STORE_MAX_QUEUED");
  // One listener per address of the list; the first picks the port when asked for 0,
  // the others take the same.
  port = want_port;
  const std::vector<std::string> binds = base::split(bind_addr, ',');
  for (const std::string& one_addr : binds) {
    const std::string where = one_addr + ":" + std::to_string(port);
    sockaddr_in sa{};
    std::string err;
    if (!resolve_ipv4(one_addr, port, true, &sa, &err))
      throw Error(ErrorCode::Network, "TcpStoreServer: cannot listen on " + where + ": " + err);
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) throw Error(ErrorCode::Network, "TcpStoreServer: socket() failed: " + errno_text(errno));
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
      int e = errno;
      throw Error(ErrorCode::Network,
                  "TcpStoreServer: cannot bind " + where + ": " + errno_text(e) +
                      (e == EADDRINUSE ? " (another store or program uses this port; pick another or use port 0)"
                       : e == EADDRNOTAVAIL
                           ? " (not an address of this host: set BRAID_STORE_BIND to one, or give the "
                             "master address as this host's address)"
                           : ""));
    }
    if (::listen(fd.get(), SOMAXCONN) != 0)
      throw Error(ErrorCode::Network, "TcpStoreServer: listen on " + where + " failed: " + errno_text(errno));
    socklen_t len = sizeof sa;
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&sa), &len) != 0)
      throw Error(ErrorCode::Network, "TcpStoreServer: getsockname failed: " + errno_text(errno));
    port = ntohs(sa.sin_port);
    listeners.push_back(std::move(fd));
  }
  addr = bind_addr + ":" + std::to_string(port);

  set_accepting(true);
  thread = std::thread([this] { run(); });
}

TcpStoreServer::Impl::~Impl() {
  stopping = true;
  poller.wake();
  if (thread.joinable()) thread.join();
  // conns (and their sockets) close as the members are destroyed.
}

void TcpStoreServer::Impl::run() noexcept {
  try {
    while (!stopping) {
      int timeout = deadlines.empty() ? -1 : ms_until(deadlines.begin()->first);
      if (!hellos.empty()) {
        const int h = ms_until(hellos.front().first);
        timeout = timeout < 0 ? h : std::min(timeout, h);
      }
      if (accept_paused) {
        int resume = ms_until(accept_resume);
        timeout = timeout < 0 ? resume : std::min(timeout, resume);
      }
      if (!read_again.empty()) timeout = 0;
      poller.wait(timeout);  // runs accept_all() and on_conn() for what is ready
      if (stopping) break;
      std::vector<std::uint64_t> again;
      again.swap(read_again);
      for (std::uint64_t id : again) on_conn(id, EPOLLIN);
      expire();
      for (std::uint64_t id : closing) close_conn(id);
      closing.clear();
      if (accept_paused && Clock::now() >= accept_resume) set_accepting(true);
    }
  } catch (const std::exception& e) {
    // Fail loudly to every client rather than leave them hanging.
    BRAID_LOG(error, "TcpStoreServer " << addr << " stopped serving: " << e.what());
  }
  waiters.clear();
  conns.clear();
  listeners.clear();
}

void TcpStoreServer::Impl::accept_all(int listen_fd) {
  for (;;) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // Typically EMFILE: the listener stays readable, so back off instead of spinning.
      BRAID_LOG(warn, "TcpStoreServer " << addr << ": accept failed: " << errno_text(errno)
                                        << "; pausing new connections for 100 ms");
      accept_resume = Clock::now() + milliseconds(100);
      set_accepting(false);
      return;
    }
    if (unauthenticated >= max_pending) {
      // Refuse the newcomer; never evict a connection already in its handshake (a real
      // rank's, perhaps) in its favour.
      ::close(fd);
      if (refused_newcomers++ % 1000 == 0)
        BRAID_LOG(warn, "TcpStoreServer " << addr << ": " << unauthenticated
                                          << " connections are in their handshake (BRAID_STORE_MAX_PENDING); refused "
                                          << refused_newcomers << " newer one(s) so far");
      continue;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::uint64_t id = next_conn++;
    Conn& c = conns[id];
    c.fd.reset(fd);
    if (tls) c.stage = Stage::tls;
    ++unauthenticated;
    hellos.emplace_back(Clock::now() + hello_timeout, id);
    try {
      watch_conn(id, fd, EPOLLIN);
    } catch (const Error& e) {
      BRAID_LOG(warn, "TcpStoreServer " << addr << ": " << e.what());
      conns.erase(id);
    }
  }
}

void TcpStoreServer::Impl::set_accepting(bool on) {
  // Paused, the listener stays registered with no events (it stays readable while
  // descriptors are short, and would wake the loop at once).
  for (const Fd& l : listeners)
    poller.watch(l.get(), on ? std::uint32_t{EPOLLIN} : 0u, [this, fd = l.get()](std::uint32_t) { accept_all(fd); });
  accept_paused = !on;
}

void TcpStoreServer::Impl::on_conn(std::uint64_t id, std::uint32_t events) {
  auto it = conns.find(id);
  if (it == conns.end() || it->second.dead) return;
  Conn& c = it->second;
  if (c.stage == Stage::tls) {
    if (!tls_step(id, c)) return;
    events |= EPOLLIN;  // the client's hello may have come with its last handshake record
  }
  if (events & EPOLLOUT) flush(id, c);
  if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
    // Bounded per wake-up so that one busy client cannot starve the others.
    char buf[65536];
    constexpr int kRounds = 16;
    int round = 0;
    for (; round < kRounds && !c.dead; ++round) {
      ssize_t r = conn_read(c, buf, sizeof buf);
      if (r > 0) {
        c.in.append(buf, static_cast<std::size_t>(r));
        process_input(id, c);
        continue;
      }
      if (r == 0) {
        drop(id, c, "");  // orderly close
      } else if (errno == EINTR) {
        continue;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
        drop(id, c, io_failure(c, "recv", errno));
      }
      break;
    }
    if (round == kRounds && c.session && !c.dead) read_again.push_back(id);
  }
}

bool TcpStoreServer::Impl::tls_step(std::uint64_t id, Conn& c) {
  if (!c.session) {
    // A client without TLS opens with the store's plaintext hello: tell it, in the one
    // plaintext answer, rather than let OpenSSL close on it without a word.
    char first[kClientHelloSize];
    const ssize_t r = ::recv(c.fd.get(), first, sizeof first, MSG_PEEK);
    if (r == 0) {
      drop(id, c, "");
      return false;
    }
    if (r < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) drop(id, c, io_failure(c, "recv", errno));
      return false;
    }
    if (first[0] == static_cast<char>(kMagic & 0xff)) {
      // Take the hello off the socket first: closing on unread bytes would reset the
      // connection, and the client might lose the answer.
      (void)::recv(c.fd.get(), first, static_cast<std::size_t>(r), 0);
      send(id, c, answer_bytes(kTlsRequired));
      drop(id, c, "refused a client without TLS (this store uses TLS, BRAID_TLS=1: set it on every rank)");
      return false;
    }
    try {
      c.session = std::make_unique<base::tls::Session>(*tls, c.fd.get(), true);
    } catch (const Error& e) {
      drop(id, c, e.what());
      return false;
    }
  }
  switch (c.session->handshake()) {
    case base::tls::Session::Step::done:
      c.stage = Stage::hello;
      BRAID_LOG(trace, "TcpStoreServer " << addr << ": TLS with a client: " << c.session->describe());
      return watch_out(id, c, false);
    case base::tls::Session::Step::want_read:
      watch_out(id, c, false);
      return false;
    case base::tls::Session::Step::want_write:
      watch_out(id, c, true);
      return false;
    case base::tls::Session::Step::failed:
      break;
  }
  drop(id, c, "TLS handshake failed: " + c.session->error());
  return false;
}

bool TcpStoreServer::Impl::watch_out(std::uint64_t id, Conn& c, bool out) {
  if (c.dead) return false;
  if (out == c.want_write) return true;
  try {
    watch_conn(id, c.fd.get(), EPOLLIN | (out ? std::uint32_t{EPOLLOUT} : 0u));
  } catch (const Error& e) {
    drop(id, c, e.what());
    return false;
  }
  c.want_write = out;
  return true;
}

void TcpStoreServer::Impl::process_input(std::uint64_t id, Conn& c) {
  while (!c.dead) {
    std::size_t avail = c.in.size() - c.in_off;
    const char* p = c.in.data() + c.in_off;
    if (c.stage == Stage::hello) {
      bool has_token = false;
      std::size_t used = 0;
      unsigned version = 0;
      switch (parse_hello(p, avail, &has_token, &c.client_nonce, &used, &version)) {
        case Hello::more:
          break;
        case Hello::not_a_store:
          // 0x16: a TLS handshake record, from a client that uses TLS.
          if (!tls && avail > 0 && p[0] == 0x16)
            return drop(id, c, "a client began a TLS handshake, and this store does not use TLS (set BRAID_TLS=1 "
                               "on it as on the ranks)");
          return drop(id, c, "bad hello (not a braid store client)");
        case Hello::version:
          return drop(id, c,
                      "client speaks protocol version " + std::to_string(version) + ", this server " +
                          std::to_string(kVersion));
        case Hello::bad_flags:
          return drop(id, c, "bad hello (unknown flags)");
        case Hello::ok:
          c.in_off += used;
          if (token.empty()) {
            // No token: the store serves anyone (and a client that has one refuses it).
            c.stage = Stage::ready;
            --unauthenticated;
            send(id, c, answer_bytes(kAccepted));
            continue;
          }
          if (!has_token) {
            send(id, c, answer_bytes(kRefused));
            return drop(id, c, "refused a client without a token (this store serves one job: set BRAID_AUTH_TOKEN "
                               "as the job's other ranks have it)");
          }
          // Prove that this server knows the token before the client proves it does.
          c.server_nonce = base::auth::random_bytes(base::auth::kNonceBytes);
          c.stage = Stage::proof;
          send(id, c, answer_bytes(kChallenge) + c.server_nonce + server_proof(token, c.client_nonce, c.server_nonce));
          continue;
      }
      break;
    }
    if (c.stage == Stage::proof) {
      if (avail < kClientProofSize) break;
      const std::string want = client_proof(token, c.client_nonce, c.server_nonce);
      if (!base::auth::equal(reinterpret_cast<const unsigned char*>(p), kClientProofSize,
                             reinterpret_cast<const unsigned char*>(want.data()), want.size())) {
        send(id, c, answer_bytes(kRefused));
        return drop(id, c, "refused a client that could not prove it knows this job's token (another job, or "
                           "BRAID_AUTH_TOKEN differs)");
      }
      c.in_off += kClientProofSize;
      c.stage = Stage::ready;
      --unauthenticated;
      send(id, c, answer_bytes(kAccepted));
      continue;
    }
    std::uint64_t len = 0;
    const Frame f = frame_at(p, avail, 1, &len);
    if (f == Frame::bad) return drop(id, c, "frame length " + std::to_string(len) + " out of range");
    if (f == Frame::more) break;
    if (!handle(id, c, p + 4, len)) return drop(id, c, "malformed request");
    c.in_off += 4 + len;
  }
  if (c.in_off == c.in.size()) {
    c.in.clear();
    c.in_off = 0;
  } else if (c.in_off > (1u << 20)) {
    c.in.erase(0, c.in_off);
    c.in_off = 0;
  }
}

bool TcpStoreServer::Impl::handle(std::uint64_t id, Conn& c, const char* p, std::size_t n) {
  Request q;
  if (!decode_request(p, n, &q)) return false;
  const std::uint32_t req = q.id;
  auto reply = [&](Status s) {
    Encoder e;
    e.u8(s);
    e.u32(req);
    return e;
  };
  // A refused request: kFailed with the reason, the connection kept.
  auto refuse = [&](const std::string& why) {
    Encoder e = reply(kFailed);
    e.str(why);
    send(id, c, e.finish());
    return true;
  };
  switch (q.op) {
    case kSet: {
      if (const std::string why = over_limit(q.key, q.value.size()); !why.empty()) return refuse(why);
      store_value(q.key, std::move(q.value));
      send(id, c, reply(kOk).finish());
      notify(q.key);
      return true;
    }
    case kGet: {
      auto it = data.find(q.key);
      if (it != data.end()) {
        Encoder e = reply(kOk);
        e.str(it->second);
        send(id, c, e.finish());
      } else {
        park(id, c, req, true, {std::move(q.key)}, q.timeout_ms);
      }
      return true;
    }
    case kAdd: {
      const std::string& key = q.key;
      const std::int64_t delta = q.delta;
      std::int64_t value = 0;
      auto it = data.find(key);
      if (it != data.end() && !parse_int64(it->second, &value))
        return refuse("the value of " + quote(key) + " is not a decimal integer");
      if (__builtin_add_overflow(value, delta, &value))
        return refuse("adding " + std::to_string(delta) + " to " + quote(key) + " overflows int64");
      std::string text = std::to_string(value);
      if (const std::string why = over_limit(key, text.size()); !why.empty()) return refuse(why);
      store_value(key, std::move(text));
      Encoder e = reply(kOk);
      e.u64(static_cast<std::uint64_t>(value));
      send(id, c, e.finish());
      notify(key);
      return true;
    }
    case kCheck: {
      Encoder e = reply(kOk);
      e.u8(has_all(q.keys) ? 1 : 0);
      send(id, c, e.finish());
      return true;
    }
    case kWait: {
      if (has_all(q.keys)) {
        send(id, c, reply(kOk).finish());
      } else {
        park(id, c, req, false, std::move(q.keys), q.timeout_ms);
      }
      return true;
    }
    case kRemove: {
      Encoder e = reply(kOk);
      auto it = data.find(q.key);
      const bool found = it != data.end();
      if (found) {
        stored_bytes -= it->first.size() + it->second.size();
        data.erase(it);
      }
      e.u8(found ? 1 : 0);
      send(id, c, e.finish());
      return true;
    }
    case kCompareSet: {
      auto it = data.find(q.key);
      const bool match = it == data.end() ? q.expected.empty() : it->second == q.expected;
      if (match) {
        if (const std::string why = over_limit(q.key, q.value.size()); !why.empty()) return refuse(why);
        store_value(q.key, std::string(q.value));
        it = data.find(q.key);
      }
      Encoder e = reply(kOk);
      e.str(it == data.end() ? std::string() : it->second);
      send(id, c, e.finish());
      if (match) notify(q.key);
      return true;
    }
    default:
      return false;  // decode_request knows no other op
  }
}

std::string TcpStoreServer::Impl::over_limit(const std::string& key, std::size_t value_bytes) const {
  auto it = data.find(key);
  const std::size_t old = it == data.end() ? 0 : key.size() + it->second.size();
  if (it == data.end() && data.size() >= max_keys)
    return "the store holds " + std::to_string(data.size()) + " keys, its limit (BRAID_STORE_MAX_KEYS)";
  if (stored_bytes - old + key.size() + value_bytes > max_bytes)
    return "storing " + std::to_string(value_bytes) + " bytes under " + quote(key) + " would pass the store's " +
           std::to_string(max_bytes) + " bytes (BRAID_STORE_MAX_BYTES)";
  return {};
}

void TcpStoreServer::Impl::park(std::uint64_t id, Conn& c, std::uint32_t req, bool is_get,
                                std::vector<std::string> keys, std::uint64_t timeout_ms) {
  if (c.parked.size() >= max_waits)
    return drop(id, c, "more than " + std::to_string(max_waits) + " blocked GET/WAIT requests (BRAID_STORE_MAX_WAITS)");
  std::uint64_t wid = next_waiter++;
  auto deadline = Clock::now() + milliseconds(std::min(timeout_ms, kMaxTimeoutMs));
  for (const auto& k : keys) waiting_on[k].insert(wid);
  deadlines.emplace(deadline, wid);
  c.parked.insert(wid);
  waiters.emplace(wid, Waiter{id, req, is_get, std::move(keys), deadline});
  // A zero timeout is answered by expire() at the end of this loop iteration.
}

void TcpStoreServer::Impl::finish_waiter(std::uint64_t wid, Status status) {
  auto it = waiters.find(wid);
  if (it == waiters.end()) return;
  Waiter w = std::move(it->second);
  waiters.erase(it);
  deadlines.erase({w.deadline, wid});
  for (const auto& k : w.keys) {
    auto wk = waiting_on.find(k);
    if (wk == waiting_on.end()) continue;
    wk->second.erase(wid);
    if (wk->second.empty()) waiting_on.erase(wk);
  }
  auto ci = conns.find(w.conn);
  if (ci == conns.end()) return;
  Conn& c = ci->second;
  c.parked.erase(wid);
  if (c.dead) return;
  Encoder e;
  e.u8(status);
  e.u32(w.req);
  if (status == kOk && w.is_get) {
    e.str(data.at(w.keys[0]));
  } else if (status == kTimeout && !w.is_get) {
    std::vector<std::string> missing;
    for (const auto& k : w.keys)
      if (!data.count(k)) missing.push_back(k);
    e.u32(static_cast<std::uint32_t>(missing.size()));
    for (const auto& k : missing) e.str(k);
  }
  send(w.conn, c, e.finish());
}

void TcpStoreServer::Impl::notify(const std::string& key) {
  auto it = waiting_on.find(key);
  if (it == waiting_on.end()) return;
  std::vector<std::uint64_t> ids(it->second.begin(), it->second.end());
  for (std::uint64_t wid : ids) {
    auto w = waiters.find(wid);
    if (w != waiters.end() && has_all(w->second.keys)) finish_waiter(wid, kOk);
  }
}

void TcpStoreServer::Impl::expire() {
  auto now = Clock::now();
  while (!hellos.empty() && hellos.front().first <= now) {
    const std::uint64_t id = hellos.front().second;
    hellos.pop_front();
    auto it = conns.find(id);
    if (it != conns.end() && it->second.stage != Stage::ready)
      drop(id, it->second,
           "no handshake within " + std::to_string(hello_timeout.count()) + " ms (BRAID_STORE_HELLO_TIMEOUT)");
  }
  while (!deadlines.empty() && deadlines.begin()->first <= now)
    finish_waiter(deadlines.begin()->second, kTimeout);
}

void TcpStoreServer::Impl::send(std::uint64_t id, Conn& c, std::string frame) {
  if (c.dead) return;
  if (c.out.size() - c.out_off + frame.size() > max_queued)
    return drop(id, c, "client does not read its replies (more than " + std::to_string(max_queued) +
                           " bytes queued, BRAID_STORE_MAX_QUEUED)");
  if (c.out_off == c.out.size()) {
    c.out = std::move(frame);
    c.out_off = 0;
  } else {
    c.out.append(frame);
  }
  flush(id, c);
}

void TcpStoreServer::Impl::flush(std::uint64_t id, Conn& c) {
  while (!c.dead && c.out_off < c.out.size()) {
    // After EAGAIN TLS wants the same bytes again: c.out keeps them from out_off on.
    ssize_t r = conn_write(c, c.out.data() + c.out_off, c.out.size() - c.out_off);
    if (r >= 0) {
      c.out_off += static_cast<std::size_t>(r);
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      break;
    } else {
      return drop(id, c, errno == EPIPE || errno == ECONNRESET ? "" : io_failure(c, "send", errno));
    }
  }
  if (c.dead) return;
  bool pending = c.out_off < c.out.size();
  if (!pending) {
    c.out.clear();
    c.out_off = 0;
  } else if (c.out_off > (1u << 20)) {
    c.out.erase(0, c.out_off);
    c.out_off = 0;
  }
  watch_out(id, c, pending);
}

void TcpStoreServer::Impl::drop(std::uint64_t id, Conn& c, const std::string& why) {
  if (c.dead) return;
  if (!why.empty()) BRAID_LOG(warn, "TcpStoreServer " << addr << ": closing a client: " << why);
  c.dead = true;
  closing.push_back(id);
}

void TcpStoreServer::Impl::close_conn(std::uint64_t id) {
  auto it = conns.find(id);
  if (it == conns.end()) return;
  std::vector<std::uint64_t> parked(it->second.parked.begin(), it->second.parked.end());
  for (std::uint64_t wid : parked) finish_waiter(wid, kTimeout);  // dead: nothing is sent
  if (it->second.stage != Stage::ready) --unauthenticated;
  poller.unwatch(it->second.fd.get());
  conns.erase(it);
}

TcpStoreServer::TcpStoreServer(const std::string& bind_addr, std::uint16_t port, const std::string& token)
    : impl_(std::make_unique<Impl>(bind_addr, port, token, core::tls_context(core::Config::global()))) {}

TcpStoreServer::TcpStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpStoreServer::~TcpStoreServer() = default;

std::uint16_t TcpStoreServer::port() const noexcept { return impl_->port; }

// ===========================================================================
// Client.

namespace {

/// One non-blocking connect attempt, waiting up to `deadline`. Returns -1 and sets `err`.
Fd connect_once(const sockaddr_in& sa, Clock::time_point deadline, std::string* err) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) {
    *err = "socket() failed: " + errno_text(errno);
    return Fd();
  }
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) {
    if (errno != EINPROGRESS && errno != EINTR) {
      *err = errno_text(errno);
      return Fd();
    }
    pollfd pfd{fd.get(), POLLOUT, 0};
    int pr;
    do {
      pr = ::poll(&pfd, 1, ms_until(deadline));
    } while (pr < 0 && errno == EINTR);
    if (pr <= 0) {
      *err = pr == 0 ? "connect timed out" : "poll failed: " + errno_text(errno);
      return Fd();
    }
    int soerr = 0;
    socklen_t len = sizeof soerr;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &soerr, &len);
    if (soerr != 0) {
      *err = errno_text(soerr);
      return Fd();
    }
  }
  // Retrying a local port that nobody listens on can make TCP connect the socket to
  // itself (simultaneous open); such a "server" would echo our own hello back.
  sockaddr_in self{}, peer{};
  socklen_t l1 = sizeof self, l2 = sizeof peer;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&self), &l1) == 0 &&
      ::getpeername(fd.get(), reinterpret_cast<sockaddr*>(&peer), &l2) == 0 &&
      self.sin_port == peer.sin_port && self.sin_addr.s_addr == peer.sin_addr.s_addr) {
    *err = "connected to itself (no server yet)";
    return Fd();
  }
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

struct TcpStore::Impl {
  Impl(const std::string& host, std::uint16_t port, bool is_server, milliseconds connect_timeout,
       const std::string& token, std::shared_ptr<const base::tls::Context> tls);
  ~Impl() = default;

  // Declared first so that it is destroyed last, after our own socket.
  std::unique_ptr<TcpStoreServer> server;
  std::string addr;  // "host:port" for messages
  std::uint16_t port = 0;
  milliseconds io_timeout{};
  Fd fd;
  // With TLS, every byte goes through `session`. An OpenSSL session is not safe for two
  // threads at once, and a sender and the reading caller may be two: tls_mu is held for
  // each call on it, never while waiting in poll.
  std::shared_ptr<const base::tls::Context> tls;
  std::unique_ptr<base::tls::Session> session;
  std::mutex tls_mu;

  std::mutex send_mu;  // one frame at a time on the socket
  std::mutex mu;       // guards everything below
  std::condition_variable cv;
  bool reading = false;  // a caller is reading replies for everyone
  std::string in;        // bytes read, owned by the reading caller
  std::uint32_t next_id = 1;
  std::unordered_map<std::uint32_t, std::shared_ptr<Reply>> pending;
  std::string broken;  // why the connection is unusable; empty while it is fine

  Encoder request(Op op) {
    Encoder e;
    e.u8(op);
    e.u32(0);  // id, patched by call()
    return e;
  }
  Reply call(Encoder& e, Clock::time_point deadline, const std::string& what);
  void read_replies(Clock::time_point deadline, std::vector<std::pair<std::uint32_t, Reply>>* got,
                    std::string* err);
  void mark_broken_locked(const std::string& why) {
    if (!broken.empty()) return;
    broken = why;
    ::shutdown(fd.get(), SHUT_RDWR);  // wakes a caller blocked in poll
    cv.notify_all();
  }
  [[noreturn]] void fail_protocol(const std::string& what) {
    std::lock_guard<std::mutex> lk(mu);
    mark_broken_locked("malformed reply");
    throw Error(ErrorCode::Network,
                "TcpStore " + addr + ": " + what + ": malformed reply from the server");
  }
  Clock::time_point io_deadline() const { return Clock::now() + io_timeout; }
  /// The TLS handshake on the connected `fd`, by `deadline`; throws.
  void tls_handshake(Clock::time_point deadline);
  /// The store handshake on the connected `fd` (tcp_store.cpp's opening comment); throws.
  void handshake(const std::string& token, Clock::time_point deadline);
  /// As send(2) / recv(2) on `fd`, through the session with TLS.
  ssize_t sock_send(const char* data, std::size_t n);
  ssize_t sock_recv(char* data, std::size_t n);
  /// Why sock_send or sock_recv failed with `e`.
  std::string io_failure(const char* call, int e);
  /// Sends all of `data` by `deadline`; "" or the reason it failed.
  std::string send_all(const char* data, std::size_t n, Clock::time_point deadline);
  /// Receives exactly `n` bytes by `deadline`; "" or the reason it failed.
  std::string recv_exact(char* data, std::size_t n, Clock::time_point deadline);
  void check_key(const std::string& key, const char* op) const { core::check_store_key("TcpStore", addr, key, op); }
};

TcpStore::Impl::Impl(const std::string& host, std::uint16_t want_port, bool is_server,
                     milliseconds connect_timeout, const std::string& token,
                     std::shared_ptr<const base::tls::Context> tls_)
    : tls(std::move(tls_)) {
  if (token.size() > kMaxToken)
    throw Error(ErrorCode::InvalidUsage, "TcpStore: a store token of " + std::to_string(token.size()) +
                                             " bytes is longer than " + std::to_string(kMaxToken));
  io_timeout = std::max(connect_timeout, kMinIoTimeout);
  port = want_port;
  std::string connect_host = host;
  if (is_server) {
    const std::string bind = core::store_bind_addresses(host);
    server = core::make_store_server(bind, want_port, token, tls);
    port = server->port();
    // Our own server, at an address it listens on: the first one bound, or loopback when it
    // listens on every address. (It listens only where it is advertised, so loopback alone
    // reaches it only when the master address is a loopback one.)
    connect_host = bind.substr(0, bind.find(','));
    if (connect_host.empty() || connect_host == "0.0.0.0") connect_host = "127.0.0.1";
  }
  addr = host + ":" + std::to_string(port);
  auto start = Clock::now();
  auto deadline = start + milliseconds(clamp_timeout(connect_timeout));
  milliseconds backoff{10};
  std::string err;
  for (;;) {
    sockaddr_in sa{};
    if (resolve_ipv4(connect_host, port, false, &sa, &err)) {
      Fd s = connect_once(sa, deadline, &err);
      if (s.get() >= 0) {
        // Once connected, allow the handshake a little time even if connect_timeout is short.
        auto hello_deadline = std::max(deadline, Clock::now() + milliseconds(5000));
        fd = std::move(s);
        if (tls) tls_handshake(hello_deadline);
        handshake(token, hello_deadline);
        return;
      }
    }
    auto now = Clock::now();
    if (now >= deadline) {
      throw TimeoutError("TcpStore: could not connect to the store server at " + addr + " within " +
                         std::to_string(connect_timeout.count()) + " ms (last error: " + err +
                         "); is the server (rank 0) running and the address reachable?");
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, milliseconds(200));
  }
}

ssize_t TcpStore::Impl::sock_send(const char* data, std::size_t n) {
  if (!session) return ::send(fd.get(), data, n, MSG_NOSIGNAL);
  std::lock_guard<std::mutex> lk(tls_mu);
  return session->write(data, n);
}

ssize_t TcpStore::Impl::sock_recv(char* data, std::size_t n) {
  if (!session) return ::recv(fd.get(), data, n, 0);
  std::lock_guard<std::mutex> lk(tls_mu);
  return session->read(data, n);
}

std::string TcpStore::Impl::io_failure(const char* call, int e) {
  if (session && e == EPROTO) {
    std::lock_guard<std::mutex> lk(tls_mu);
    return "TLS: " + session->error();
  }
  return std::string(call) + " failed: " + errno_text(e);
}

std::string TcpStore::Impl::send_all(const char* data, std::size_t n, Clock::time_point deadline) {
  // With TLS, after EAGAIN the same bytes are offered again (the session has sealed them).
  std::size_t off = 0;
  while (off < n) {
    ssize_t r = sock_send(data + off, n - off);
    if (r >= 0) {
      off += static_cast<std::size_t>(r);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return io_failure("send", errno);
    pollfd pfd{fd.get(), POLLOUT, 0};
    int pr = ::poll(&pfd, 1, ms_until(deadline));
    if (pr == 0) return "timed out sending to the server";
    if (pr < 0 && errno != EINTR) return "poll failed: " + errno_text(errno);
  }
  return {};
}

std::string TcpStore::Impl::recv_exact(char* data, std::size_t n, Clock::time_point deadline) {
  // Reads before it polls: with TLS the bytes may already wait inside the session.
  std::size_t off = 0;
  while (off < n) {
    ssize_t r = sock_recv(data + off, n - off);
    if (r > 0) {
      off += static_cast<std::size_t>(r);
      continue;
    }
    if (r == 0) return "the server closed the connection";
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return io_failure("recv", errno);
    pollfd pfd{fd.get(), POLLIN, 0};
    int pr = ::poll(&pfd, 1, ms_until(deadline));
    if (pr == 0) return "timed out waiting for the server";
    if (pr < 0 && errno != EINTR) return "poll failed: " + errno_text(errno);
  }
  return {};
}

void TcpStore::Impl::tls_handshake(Clock::time_point deadline) {
  const auto start = Clock::now();
  const std::string hint =
      " (this client uses TLS, BRAID_TLS=1: the store server must too, with a certificate that this client's "
      "BRAID_TLS_CA signed, and accept this client's BRAID_TLS_CERT)";
  // No other thread has this store yet; the lock is for the rule (held per call, never
  // across poll) rather than for a race.
  std::unique_lock<std::mutex> lk(tls_mu);
  session = std::make_unique<base::tls::Session>(*tls, fd.get(), false);
  for (;;) {
    if (!lk.owns_lock()) lk.lock();
    const base::tls::Session::Step step = session->handshake();
    if (step == base::tls::Session::Step::done) {
      BRAID_LOG(trace, "TcpStore " << addr << ": " << session->describe());
      return;
    }
    if (step == base::tls::Session::Step::failed)
      throw Error(ErrorCode::Network,
                  "TcpStore: the TLS handshake with the store server at " + addr + " failed: " + session->error() + hint);
    lk.unlock();
    pollfd pfd{fd.get(), static_cast<short>(step == base::tls::Session::Step::want_read ? POLLIN : POLLOUT), 0};
    const int pr = ::poll(&pfd, 1, ms_until(deadline));
    if (pr == 0)
      throw TimeoutError("TcpStore: the store server at " + addr + " did not complete the TLS handshake within " +
                         std::to_string(std::chrono::duration_cast<milliseconds>(Clock::now() - start).count()) +
                         " ms" + hint);
    if (pr < 0 && errno != EINTR)
      throw Error(ErrorCode::Network, "TcpStore: TLS handshake with " + addr + ": poll failed: " + errno_text(errno));
  }
}

void TcpStore::Impl::handshake(const std::string& token, Clock::time_point deadline) {
  auto failed = [&](const std::string& why) {
    if (session)
      return Error(ErrorCode::Network,
                   "TcpStore: " + addr + " did not complete the store handshake over TLS (" + why +
                       "): the store server may have refused this client's certificate (BRAID_TLS_CERT must be "
                       "signed by the CA the store trusts; the server's log says why), or it is not a braid store "
                       "server of this protocol version");
    return Error(ErrorCode::Network, "TcpStore: " + addr + " did not complete the store handshake (" + why +
                                         "): it is not a braid store server, or one of another protocol version");
  };
  const std::string nonce = base::auth::random_bytes(base::auth::kNonceBytes);
  const std::string hello = hello_bytes(!token.empty(), nonce);
  std::string err = send_all(hello.data(), hello.size(), deadline);
  char head[kHelloSize];
  if (err.empty()) err = recv_exact(head, sizeof head, deadline);
  if (!err.empty()) throw failed(err);
  const std::string answer(head, sizeof head);
  if (answer == answer_bytes(kTlsRequired))
    throw Error(ErrorCode::InvalidUsage,
                "TcpStore: the store server at " + addr +
                    " uses TLS (BRAID_TLS=1 there) and this client does not: set BRAID_TLS=1, BRAID_TLS_CERT, "
                    "BRAID_TLS_KEY and BRAID_TLS_CA on every rank as on the store");
  const Error refused(ErrorCode::InvalidUsage,
                      "TcpStore: the store server at " + addr +
                          " refused this client: it serves a job with a token (BRAID_AUTH_TOKEN) and this client "
                          "has " +
                          (token.empty() ? std::string("none") : std::string("another")) +
                          " (set the same token on every rank and on the store)");
  if (answer == answer_bytes(kRefused)) throw refused;
  if (answer == answer_bytes(kAccepted)) {
    if (!token.empty())
      throw Error(ErrorCode::InvalidUsage,
                  "TcpStore: the store server at " + addr +
                      " accepted this client without asking for the job's token (BRAID_AUTH_TOKEN): it is not this "
                      "job's store, or was started without the token; refusing to use it");
    return;
  }
  if (answer != answer_bytes(kChallenge) || token.empty()) throw failed("unexpected reply");
  char rest[kChallengeSize - kHelloSize];
  err = recv_exact(rest, sizeof rest, deadline);
  if (!err.empty()) throw failed(err);
  const std::string server_nonce(rest, base::auth::kNonceBytes);
  const std::string want = server_proof(token, nonce, server_nonce);
  if (!base::auth::equal(reinterpret_cast<const unsigned char*>(rest) + base::auth::kNonceBytes, base::auth::kMacBytes,
                         reinterpret_cast<const unsigned char*>(want.data()), want.size()))
    throw Error(ErrorCode::InvalidUsage,
                "TcpStore: the store server at " + addr +
                    " does not know the token this client has (it could not prove it): the token "
                    "(BRAID_AUTH_TOKEN) differs between this rank and the store, or this is another job's store or "
                    "a program in its place; refusing to use it");
  const std::string proof = client_proof(token, nonce, server_nonce);
  err = send_all(proof.data(), proof.size(), deadline);
  if (err.empty()) err = recv_exact(head, sizeof head, deadline);
  if (!err.empty()) throw failed(err);
  if (std::string(head, sizeof head) == answer_bytes(kRefused)) throw refused;
  if (std::string(head, sizeof head) != answer_bytes(kAccepted)) throw failed("unexpected reply");
}

void TcpStore::Impl::read_replies(Clock::time_point deadline,
                                  std::vector<std::pair<std::uint32_t, Reply>>* got,
                                  std::string* err) {
  // Reads first and polls only when nothing is there: with TLS, a read that filled the
  // buffer may leave plaintext inside the session, which poll cannot see.
  char buf[65536];
  bool waited = false;
  for (int round = 0; round < 64; ++round) {
    ssize_t r = sock_recv(buf, sizeof buf);
    if (r > 0) {
      in.append(buf, static_cast<std::size_t>(r));
      if (static_cast<std::size_t>(r) < sizeof buf) break;
      continue;
    }
    if (r == 0) {
      *err = "the server closed the connection";
    } else if (errno == EINTR) {
      continue;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
      *err = io_failure("recv", errno);
    } else if (round == 0 && !waited) {
      pollfd pfd{fd.get(), POLLIN, 0};
      const int pr = ::poll(&pfd, 1, ms_until(deadline));
      if (pr < 0 && errno != EINTR) *err = "poll failed: " + errno_text(errno);
      if (pr <= 0) return;
      waited = true;
      --round;  // the read after the wait is the first
      continue;
    }
    break;
  }
  std::string bad;
  in.erase(0, take_replies(in, got, &bad));
  if (!bad.empty()) *err = bad;
}

Reply TcpStore::Impl::call(Encoder& e, Clock::time_point deadline, const std::string& what) {
  auto rep = std::make_shared<Reply>();
  std::uint32_t id;
  {
    std::lock_guard<std::mutex> lk(mu);
    if (!broken.empty())
      throw Error(ErrorCode::Network,
                  "TcpStore " + addr + ": " + what +
                      ": the connection to the store server was lost earlier (" + broken + ")");
    id = next_id++;
    if (next_id == 0) next_id = 1;
    pending[id] = rep;
  }
  e.patch_u32(5, id);
  std::string frame = e.finish();
  std::string err;
  {
    std::lock_guard<std::mutex> lk(send_mu);
    err = send_all(frame.data(), frame.size(), deadline);
  }
  std::unique_lock<std::mutex> lk(mu);
  if (!err.empty()) {
    pending.erase(id);
    mark_broken_locked(err);
    throw Error(ErrorCode::Network, "TcpStore " + addr + ": " + what + ": " + err);
  }
  while (!rep->done && broken.empty() && Clock::now() < deadline) {
    if (reading) {
      cv.wait_until(lk, deadline);
      continue;
    }
    reading = true;
    lk.unlock();
    std::vector<std::pair<std::uint32_t, Reply>> got;
    std::string rerr;
    read_replies(deadline, &got, &rerr);
    lk.lock();
    reading = false;
    for (auto& g : got) {
      auto it = pending.find(g.first);
      if (it != pending.end()) *it->second = std::move(g.second);  // else: a caller gave up
    }
    if (!rerr.empty()) mark_broken_locked(rerr);
    cv.notify_all();  // replies for others, or the reader role is free
  }
  pending.erase(id);
  if (rep->done) return std::move(*rep);
  if (!broken.empty())
    throw Error(ErrorCode::Network, "TcpStore " + addr + ": " + what +
                                        ": lost the connection to the store server (" + broken +
                                        ")");
  throw TimeoutError("TcpStore " + addr + ": " + what +
                     ": the store server did not answer in time (is it alive and reachable?)");
}

TcpStore::TcpStore(const std::string& host, std::uint16_t port, bool is_server,
                   std::chrono::milliseconds connect_timeout, const std::string& token)
    : impl_(std::make_unique<Impl>(host, port, is_server, connect_timeout, token,
                                   core::tls_context(core::Config::global()))) {}

TcpStore::TcpStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpStore::~TcpStore() = default;

std::uint16_t TcpStore::port() const noexcept { return impl_->port; }

void TcpStore::set(const std::string& key, const std::string& value) {
  impl_->check_key(key, "set");
  core::check_store_value("TcpStore", impl_->addr, key, value);
  Encoder e = impl_->request(kSet);
  e.str(key);
  e.str(value);
  std::string what = "set(" + quote(key) + ")";
  Reply r = impl_->call(e, impl_->io_deadline(), what);
  if (r.status == kFailed)
    throw Error(ErrorCode::InvalidUsage, "TcpStore " + impl_->addr + ": " + what + ": " + reply_error(r.payload));
  if (r.status != kOk || !r.payload.empty()) impl_->fail_protocol(what);
}

std::string TcpStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  impl_->check_key(key, "get");
  std::uint64_t t = clamp_timeout(timeout);
  Encoder e = impl_->request(kGet);
  e.str(key);
  e.u64(t);
  std::string what = "get(" + quote(key) + ")";
  Reply r = impl_->call(e, Clock::now() + milliseconds(t) + kReplyGrace, what);
  if (r.status == kTimeout)
    throw TimeoutError("TcpStore " + impl_->addr + ": " + what + " timed out after " +
                       std::to_string(timeout.count()) + " ms: the key was not set");
  std::string value;
  if (r.status != kOk || !reply_value(r.payload, &value)) impl_->fail_protocol(what);
  return value;
}

std::int64_t TcpStore::add(const std::string& key, std::int64_t delta) {
  impl_->check_key(key, "add");
  Encoder e = impl_->request(kAdd);
  e.str(key);
  e.u64(static_cast<std::uint64_t>(delta));
  std::string what = "add(" + quote(key) + ", " + std::to_string(delta) + ")";
  Reply r = impl_->call(e, impl_->io_deadline(), what);
  if (r.status == kFailed)
    throw Error(ErrorCode::InvalidUsage, "TcpStore " + impl_->addr + ": " + what + ": " + reply_error(r.payload));
  std::int64_t v = 0;
  if (r.status != kOk || !reply_int(r.payload, &v)) impl_->fail_protocol(what);
  return v;
}

namespace {
void put_keys(Encoder& e, const std::vector<std::string>& keys, const std::string& addr,
              const char* op) {
  std::size_t bytes = 0;
  for (const auto& k : keys) bytes += 4 + k.size();
  if (keys.size() > kMaxKeysPerRequest || bytes > kMaxFrame - 64)
    throw Error(ErrorCode::InvalidUsage, "TcpStore " + addr + ": " + op + ": too many keys (" +
                                             std::to_string(keys.size()) + ")");
  e.u32(static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) e.str(k);
}
}  // namespace

bool TcpStore::check(const std::vector<std::string>& keys) {
  for (const auto& k : keys) impl_->check_key(k, "check");
  Encoder e = impl_->request(kCheck);
  put_keys(e, keys, impl_->addr, "check");
  Reply r = impl_->call(e, impl_->io_deadline(), "check(" + quote_keys(keys) + ")");
  bool all = false;
  if (r.status != kOk || !reply_flag(r.payload, &all)) impl_->fail_protocol("check");
  return all;
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  for (const auto& k : keys) impl_->check_key(k, "wait");
  std::uint64_t t = clamp_timeout(timeout);
  Encoder e = impl_->request(kWait);
  put_keys(e, keys, impl_->addr, "wait");
  e.u64(t);
  std::string what = "wait(" + quote_keys(keys) + ")";
  Reply r = impl_->call(e, Clock::now() + milliseconds(t) + kReplyGrace, what);
  if (r.status == kTimeout) {
    std::vector<std::string> missing;
    if (!reply_missing(r.payload, &missing)) impl_->fail_protocol(what);
    throw TimeoutError("TcpStore " + impl_->addr + ": wait timed out after " +
                       std::to_string(timeout.count()) +
                       " ms; keys not set: " + quote_keys(missing));
  }
  if (r.status != kOk || !r.payload.empty()) impl_->fail_protocol(what);
}

bool TcpStore::remove(const std::string& key) {
  impl_->check_key(key, "remove");
  Encoder e = impl_->request(kRemove);
  e.str(key);
  std::string what = "remove(" + quote(key) + ")";
  Reply r = impl_->call(e, impl_->io_deadline(), what);
  bool removed = false;
  if (r.status != kOk || !reply_flag(r.payload, &removed)) impl_->fail_protocol(what);
  return removed;
}

std::string TcpStore::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  impl_->check_key(key, "compare_set");
  core::check_store_value("TcpStore", impl_->addr, key, desired);
  core::check_store_value("TcpStore", impl_->addr, key, expected);
  if (expected.size() + desired.size() > kMaxValue)  // both in one request frame
    throw Error(ErrorCode::InvalidUsage, "TcpStore " + impl_->addr + ": compare_set(" + quote(key) +
                                             "): the expected and desired values together exceed " +
                                             std::to_string(kMaxValue) + " bytes");
  Encoder e = impl_->request(kCompareSet);
  e.str(key);
  e.str(expected);
  e.str(desired);
  std::string what = "compare_set(" + quote(key) + ")";
  Reply r = impl_->call(e, impl_->io_deadline(), what);
  if (r.status == kFailed)
    throw Error(ErrorCode::InvalidUsage, "TcpStore " + impl_->addr + ": " + what + ": " + reply_error(r.payload));
  std::string value;
  if (r.status != kOk || !reply_value(r.payload, &value)) impl_->fail_protocol(what);
  return value;
}

namespace core {

std::unique_ptr<TcpStoreServer> make_store_server(const std::string& bind_addr, std::uint16_t port,
                                                  const std::string& token,
                                                  std::shared_ptr<const base::tls::Context> tls) {
  return std::make_unique<TcpStoreServer>(
      std::make_unique<TcpStoreServer::Impl>(bind_addr, port, token, std::move(tls)));
}

std::unique_ptr<TcpStore> make_store_client(const std::string& host, std::uint16_t port, bool is_server,
                                            std::chrono::milliseconds connect_timeout, const std::string& token,
                                            std::shared_ptr<const base::tls::Context> tls) {
  return std::make_unique<TcpStore>(
      std::make_unique<TcpStore::Impl>(host, port, is_server, connect_timeout, token, std::move(tls)));
}

}  // namespace core
}  // namespace braid
