// Tests of the Poller and of what only the TCP transport has (connect retries, hellos,
// striping, mismatched settings, address selection); the contract every transport keeps is
// in test_transport_conformance.cpp. Ranks run as threads in one process,
// each with its own Poller and transport, over an in-memory PeerDirectory; raw
// sockets play misbehaving peers. Every wait has a deadline.
#include "base/poller.hpp"
#include "transport_harness.hpp"
#include "transport/tcp/tcp_transport.hpp"
#include "transport/tcp/wire.hpp"
#include "transport/skeleton.hpp"
#include "base/auth.hpp"
#include "base/tls.hpp"
#include "test_pki.hpp"

#include <braid/error.hpp>

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace wire = braid::transport::tcp_wire;
using namespace braid::test;
using namespace std::chrono_literals;

namespace {

constexpr auto kDeadline = 30s;
constexpr std::uint64_t kCommId = 42;
const char* const kToken = "secret-token";

bt::TcpOptions options(int rank, int size, int sockets = 1) {
  bt::TcpOptions o;
  static_cast<bt::CommonOptions&>(o) = common_options(rank, size, kCommId);
  o.auth_token = kToken;
  o.sockets_per_peer = sockets;
  o.master_addr = "127.0.0.1";
  return o;
}

/// A TCP rank with these options over a MemDirectory (transport_harness.hpp).
struct Rank : RankDirectory, TransportRank {
  Rank(MemDirectory& d, const bt::TcpOptions& o)
      : RankDirectory(d, o.rank),
        TransportRank(*this, o, [o](const bt::CommonOptions&, bt::Poller& p, bt::PeerDirectory& dir) {
          return bt::make_tcp_transport(o, p, dir);
        }) {}
};

// ---------------------------------------------------------------------------
// Raw sockets that play (mis)behaving peers.

int raw_connect(const std::string& addr) {
  const auto colon = addr.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(std::stoi(addr.substr(colon + 1))));
  ::inet_pton(AF_INET, addr.substr(0, colon).c_str(), &a.sin_addr);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    ADD_FAILURE() << "connect to " << addr << ": " << std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

bool write_all(int fd, const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t r = ::send(fd, p, n, MSG_NOSIGNAL);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

/// Reads exactly n bytes within the deadline.
bool read_all(int fd, void* data, std::size_t n, Clock::duration limit = 10s) {
  auto* p = static_cast<char*>(data);
  const auto deadline = Clock::now() + limit;
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0 || ::poll(&pfd, 1, static_cast<int>(left)) <= 0) return false;
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

/// True once the other side has closed `fd` (EOF or reset) within the deadline.
std::string hello(int from, int to, int index = 0, int sockets = 1, std::uint64_t comm = kCommId,
                  const std::string& token = kToken) {
  wire::Hello h;
  h.socket_index = static_cast<std::uint16_t>(index);
  h.sockets_per_peer = static_cast<std::uint16_t>(sockets);
  h.token_bytes = static_cast<std::uint16_t>(braid::base::auth::kProofBytes);
  h.from_rank = from;
  h.to_rank = to;
  h.comm_id = comm;
  const std::string fixed = wire::hello_bytes(h, "");
  return fixed + braid::transport::hello_proof(token, fixed);  // as the transport makes it
}

/// A raw listener on loopback published as rank 1's tcp address: plays rank 1. -1 on failure.
int listen_as_rank1(MemDirectory& dir) {
  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  socklen_t len = sizeof a;
  if (lfd < 0 || ::bind(lfd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 || ::listen(lfd, 8) != 0 ||
      ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ADD_FAILURE() << "raw listener: " << std::strerror(errno);
    if (lfd >= 0) ::close(lfd);
    return -1;
  }
  dir.publish(1, "tcp", "127.0.0.1:" + std::to_string(ntohs(a.sin_port)));
  return lfd;
}

std::string part_header(std::uint64_t seq, std::uint64_t tag, std::uint64_t msg_bytes,
                        std::uint64_t part_bytes, int index = 0) {
  wire::PartHeader h;
  h.seq = seq;
  h.tag = tag;
  h.msg_bytes = msg_bytes;
  h.part_bytes = part_bytes;
  h.part_index = static_cast<std::uint16_t>(index);
  std::string out(wire::kPartHeaderBytes, '\0');
  wire::encode(h, reinterpret_cast<unsigned char*>(&out[0]));
  return out;
}

// ---------------------------------------------------------------------------
// Poller.

struct Pipe {
  Pipe() {
    int fds[2];
    if (::pipe(fds) == 0) {
      r = fds[0];
      w = fds[1];
    }
  }
  ~Pipe() {
    if (r >= 0) ::close(r);
    if (w >= 0) ::close(w);
  }
  int r = -1, w = -1;
};

TEST(Poller, WakeFromAnotherThreadEndsWait) {
  bt::Poller p;
  std::thread t([&] {
    std::this_thread::sleep_for(50ms);
    p.wake();
  });
  const auto t0 = Clock::now();
  const int n = p.wait(5000);
  t.join();
  EXPECT_EQ(n, 1);
  EXPECT_LT(Clock::now() - t0, 2s);
  EXPECT_EQ(p.wait(0), 0) << "the wake-up must be consumed";
}

// wake_at(): a sleeping thread wakes at the latest time asked for, not at an earlier one
// that a later call moved on, and not again once it has woken for it.
TEST(Poller, WakeAtWakesAtTheLatestTimeAskedFor) {
  bt::Poller p;
  auto t0 = Clock::now();
  p.wake_at(t0 + 30ms);
  p.wake_at(t0 + 150ms);  // moves it on: the timer armed for 30 ms fires early
  EXPECT_EQ(p.wait(5000), 1);
  const auto woke = Clock::now() - t0;
  EXPECT_GE(woke, 150ms);
  EXPECT_LT(woke, 2s);
  t0 = Clock::now();
  EXPECT_EQ(p.wait(100), 0) << "woken twice for one time";
  EXPECT_GE(Clock::now() - t0, 90ms) << "a wait with a timeout ended early";
  // A time already past wakes at once; from another thread too.
  p.wake_at(Clock::now() - 1ms);
  EXPECT_EQ(p.wait(5000), 1);
  std::thread t([&] { p.wake_at(Clock::now() + 20ms); });
  t0 = Clock::now();
  EXPECT_EQ(p.wait(5000), 1);
  t.join();
  EXPECT_LT(Clock::now() - t0, 2s);
}

TEST(Poller, RunsHandlerWithEventMaskAndStopsAfterUnwatch) {
  bt::Poller p;
  Pipe a;
  std::uint32_t seen = 0;
  int calls = 0;
  p.watch(a.r, EPOLLIN, [&](std::uint32_t ev) {
    seen = ev;
    ++calls;
  });
  EXPECT_EQ(p.wait(0), 0);
  ASSERT_EQ(::write(a.w, "x", 1), 1);
  EXPECT_EQ(p.wait(1000), 1);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(seen & EPOLLIN);
  p.unwatch(a.r);
  EXPECT_EQ(p.wait(0), 0);
  EXPECT_EQ(calls, 1);
  p.unwatch(a.r);  // unwatching twice is harmless
}

TEST(Poller, HandlerMayUnwatchItsOwnFdAndAnotherFdOfTheSameBatch) {
  bt::Poller p;
  Pipe a, b;
  int calls_a = 0, calls_b = 0, calls_new = 0;
  std::unique_ptr<Pipe> replacement;
  // Whichever handler runs first unwatches and closes the other's fd and opens a new
  // pipe (likely reusing that fd number) watched by a third handler. The other
  // handler's event, already fetched in the same batch, must not run anything.
  auto swap_other = [&](int& other_fd, int other_w, int self_fd) {
    p.unwatch(other_fd);
    ::close(other_fd);
    ::close(other_w);
    other_fd = -1;
    replacement = std::make_unique<Pipe>();
    p.watch(replacement->r, EPOLLIN, [&](std::uint32_t) { ++calls_new; });
    p.unwatch(self_fd);
  };
  p.watch(a.r, EPOLLIN, [&](std::uint32_t) {
    ++calls_a;
    swap_other(b.r, b.w, a.r);
    b.w = -1;
  });
  p.watch(b.r, EPOLLIN, [&](std::uint32_t) {
    ++calls_b;
    swap_other(a.r, a.w, b.r);
    a.w = -1;
  });
  ASSERT_EQ(::write(a.w, "x", 1), 1);
  ASSERT_EQ(::write(b.w, "y", 1), 1);
  EXPECT_EQ(p.wait(1000), 1);
  EXPECT_EQ(calls_a + calls_b, 1);
  EXPECT_EQ(calls_new, 0);
  EXPECT_EQ(p.wait(0), 0);
  ASSERT_TRUE(replacement);
  ASSERT_EQ(::write(replacement->w, "z", 1), 1);
  EXPECT_EQ(p.wait(1000), 1);
  EXPECT_EQ(calls_new, 1);
}

TEST(TcpTransport, RefusedConnectRetriesUntilTheTimeoutThenFails) {
  MemDirectory dir;
  int port = 0;
  {
    // A port with nothing listening on it.
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a), 0);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    ::close(fd);
  }
  dir.publish(1, "tcp", "127.0.0.1:" + std::to_string(port));
  auto o = options(0, 2);
  o.connect_timeout = 300ms;
  Rank r(dir, o);
  std::uint64_t v = 0;
  bt::Request q;
  r.to(1)->recv(&v, sizeof v, 1, &q);
  const auto t0 = Clock::now();
  // Long waits: only the transport's own timer can wake the poller for retries.
  while (q.state == State::pending && Clock::now() - t0 < 10s) {
    if (!r.transport->progress()) r.poller.wait(5000);
  }
  const auto took = Clock::now() - t0;
  ASSERT_EQ(q.state, State::failed);
  EXPECT_TRUE(contains(q.error, "cannot connect to rank 1 at 127.0.0.1:" + std::to_string(port))) << q.error;
  EXPECT_EQ(q.failed_peer, 1);
  EXPECT_GE(took, 250ms);
  EXPECT_LT(took, 3s);
}

// ---------------------------------------------------------------------------
// Untrusted input.

TEST(TcpTransport, BadHellosAreRefusedAndTheRealPeerStillConnects) {
  MemDirectory dir;
  std::string big_token = hello(0, 1);
  big_token[10] = '\xff';  // token length 0xff.. > the limit
  big_token[11] = '\xff';
  expect_impostors_refused([&](int r) { return std::make_unique<Rank>(dir, options(r, 2)); },
                           [&] { return raw_connect(dir.lookup(1, "tcp", 10s)); },
                           {
                               {"wrong token", hello(0, 1, 0, 1, kCommId, "not-the-token")},
                               {"empty token", hello(0, 1, 0, 1, kCommId, "")},
                               {"other communicator", hello(0, 1, 0, 1, kCommId + 1)},
                               {"rank out of range", hello(5, 1)},
                               {"rank that should accept, not connect", hello(1, 1)},
                               {"addressed to another rank", hello(0, 2)},
                               {"oversized token", big_token},
                               {"not a hello", "GET / HTTP/1.1\r\nHost: x\r\n\r\n"},
                           });
}

TEST(TcpTransport, SilentConnectionIsDroppedAtTheHelloDeadline) {
  MemDirectory dir;
  auto o = options(1, 2);
  o.connect_timeout = 200ms;  // hellos get max(connect_timeout, 1 s)
  std::atomic<bool> stop{false};
  std::thread t1([&] {
    Rank r(dir, o);
    const auto deadline = Clock::now() + kDeadline;
    while (!stop && Clock::now() < deadline) {
      r.step();
    }
  });
  const int fd = raw_connect(dir.lookup(1, "tcp", 10s));
  const auto t0 = Clock::now();
  EXPECT_TRUE(wait_closed(fd, 5s));
  EXPECT_GE(Clock::now() - t0, 900ms);
  stop = true;
  ::close(fd);
  t1.join();
}

struct BadStream {
  const char* name;
  std::string bytes;       // sent after a valid hello
  const char* error_part;  // expected in the error
  bool peer_closed;
};

class TcpBadStream : public ::testing::TestWithParam<int> {};

TEST_P(TcpBadStream, AuthenticatedPeerSendingGarbageGetsAClearError) {
  const std::vector<BadStream> cases = {
      {"garbage header", std::string(40, '\xab'), "corrupt message header", false},
      {"wrong sequence number", part_header(5, 9, 100, 100), "expected message #0 part 0, got message #5", false},
      {"part longer than the message", part_header(0, 9, 100, std::uint64_t{1} << 40), "has length 1099511627776",
       false},
      {"wrong part index", part_header(0, 9, 100, 100, 3), "expected message #0 part 0, got message #0 part 3",
       false},
      {"stream cut inside the payload", part_header(0, 9, 100, 100) + std::string(10, 'x'),
       "closed by peer in the middle of a message", true},
  };
  const BadStream& bad = cases[static_cast<std::size_t>(GetParam())];
  MemDirectory dir;
  bt::Request q;
  std::vector<std::uint8_t> in(100);
  std::thread t1([&] {
    Rank r(dir, options(1, 2));
    r.to(0)->recv(in.data(), in.size(), 9, &q);
    r.drive({&q}, 10s);
  });
  const int fd = raw_connect(dir.lookup(1, "tcp", 10s));
  ASSERT_GE(fd, 0);
  const std::string stream = hello(0, 1) + bad.bytes;
  write_all(fd, stream.data(), stream.size());
  if (bad.peer_closed) ::shutdown(fd, SHUT_WR);
  t1.join();
  ::close(fd);
  ASSERT_EQ(q.state, State::failed) << bad.name;
  EXPECT_TRUE(contains(q.error, bad.error_part)) << bad.name << ": " << q.error;
  EXPECT_TRUE(contains(q.error, "rank 0")) << q.error;
  EXPECT_EQ(q.failed_peer, 0);
  EXPECT_EQ(q.peer_closed, bad.peer_closed) << q.error;
}

INSTANTIATE_TEST_SUITE_P(Cases, TcpBadStream, ::testing::Range(0, 5));

TEST(TcpTransport, MismatchedSocketsPerPeerIsReportedClearly) {
  MemDirectory dir;
  bt::Request q;
  std::uint64_t v = 0;
  std::thread t1([&] {
    Rank r(dir, options(1, 2, 2));
    r.to(0)->recv(&v, sizeof v, 1, &q);
    r.drive({&q}, 10s);
  });
  const int fd = raw_connect(dir.lookup(1, "tcp", 10s));
  ASSERT_GE(fd, 0);
  const std::string h = hello(0, 1, 0, 4);
  write_all(fd, h.data(), h.size());
  t1.join();
  ::close(fd);
  ASSERT_EQ(q.state, State::failed);
  EXPECT_TRUE(contains(q.error, "rank 0 uses 4 sockets per peer, rank 1 uses 2")) << q.error;
}

// A live peer that posts its receive late (a rank in a long checkpoint or evaluation) keeps
// the sender's socket at a zero window for longer than the dead-peer detection time. That
// is not a dead peer: the send completes once the receive is posted. (Linux applies
// TCP_USER_TIMEOUT to zero-window probing too, so braid does not use it: docs/
// transport-tcp.md, "Dead peers".)
TEST(TcpTransport, AReceiverLateByMoreThanTheDetectionTimeIsNotDead) {
  MemDirectory dir;
  const auto late = 3s;
  std::vector<std::uint8_t> out(std::size_t{48} << 20, 7), in(out.size(), 0);
  bt::Request s, q;
  std::thread receiver([&] {
    auto o = options(1, 2);
    o.connect_timeout = 1s;  // detection after 1 s without acknowledgement
    Rank r(dir, o);
    r.step_for(late);  // connected, reading nothing: the sender's window closes
    r.to(0)->recv(in.data(), in.size(), 9, &q);
    r.drive({&q}, 20s);
  });
  auto o = options(0, 2);
  o.connect_timeout = 1s;
  Rank r(dir, o);
  const auto t0 = Clock::now();
  r.to(1)->send(out.data(), out.size(), 9, &s);
  r.drive({&s}, 20s);
  receiver.join();
  EXPECT_EQ(s.state, State::done) << s.error;
  EXPECT_EQ(q.state, State::done) << q.error;
  EXPECT_GE(Clock::now() - t0, late - 500ms);
  EXPECT_TRUE(in == out);
}

// Mutual authentication: the accepting end answers the hello with a proof of the token
// before any data. A program in rank 1's place (it read the published address, or took the
// port) that cannot give one gets nothing into rank 0's receives: rank 0 fails the
// connection saying so. A real answer (computed here with the token) is accepted.
TEST(TcpTransport, AnAcceptorThatCannotProveTheTokenIsRefused) {
  for (const bool knows_token : {false, true}) {
    SCOPED_TRACE(knows_token ? "answer with the token" : "answer without it");
    MemDirectory dir;
    const int lfd = listen_as_rank1(dir);
    ASSERT_GE(lfd, 0);
    std::uint64_t got = 0;
    bt::Request q;
    std::thread t0([&] {
      Rank r(dir, options(0, 2));
      r.to(1)->recv(&got, sizeof got, 5, &q);
      r.drive({&q}, 10s);
    });
    pollfd pfd{lfd, POLLIN, 0};
    ASSERT_EQ(::poll(&pfd, 1, 10000), 1) << "rank 0 did not connect";
    const int fd = ::accept(lfd, nullptr, nullptr);
    ASSERT_GE(fd, 0);
    std::string hello(wire::kHelloBytes + braid::base::auth::kProofBytes, '\0');
    ASSERT_TRUE(read_all(fd, &hello[0], hello.size()));
    const std::string answer = braid::base::auth::prove(knows_token ? kToken : "not-the-token", wire::answer_context(hello));
    const std::uint64_t value = 0x1122334455667788ull;
    const std::string msg = answer + part_header(0, 5, sizeof value, sizeof value) +
                            std::string(reinterpret_cast<const char*>(&value), sizeof value);
    ASSERT_EQ(::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL), static_cast<ssize_t>(msg.size()));
    t0.join();
    if (knows_token) {
      EXPECT_DONE(q);
      EXPECT_EQ(got, value);
    } else {
      EXPECT_EQ(q.state, State::failed);
      EXPECT_TRUE(contains(q.error, "could not prove it knows the job's token")) << q.error;
      EXPECT_EQ(got, 0u) << "data from an unproven end reached the receive";
    }
    ::close(fd);
    ::close(lfd);
  }
}

TEST(TcpTransport, WireFormatStripesMessagesAcrossSocketsAsDocumented) {
  // A raw socket server plays rank 1 and checks byte by byte what rank 0 sends.
  MemDirectory dir;
  const int lfd = listen_as_rank1(dir);
  ASSERT_GE(lfd, 0);

  const auto big = pattern(256 << 10, 1);
  const std::uint8_t small = 0x5a;
  std::atomic<bool> checked{false};
  std::thread t0([&] {
    Rank r(dir, options(0, 2, 2));
    bt::Request s1, s2;
    r.to(1)->send(big.data(), big.size(), 11, &s1);
    r.to(1)->send(&small, 1, 12, &s2);
    EXPECT_TRUE(r.drive({&s1, &s2}));
    EXPECT_DONE(s1);
    EXPECT_DONE(s2);
    const auto deadline = Clock::now() + kDeadline;
    while (!checked && Clock::now() < deadline) r.step();
  });
  int socks[2] = {-1, -1};
  for (int i = 0; i < 2; ++i) {
    pollfd pfd{lfd, POLLIN, 0};
    ASSERT_EQ(::poll(&pfd, 1, 10000), 1) << "rank 0 did not connect";
    const int fd = ::accept(lfd, nullptr, nullptr);
    ASSERT_GE(fd, 0);
    unsigned char raw[wire::kHelloBytes];
    ASSERT_TRUE(read_all(fd, raw, sizeof raw));
    const wire::Hello h = wire::decode_hello(raw);
    EXPECT_EQ(h.magic, wire::kHelloMagic);
    EXPECT_EQ(h.version, wire::kVersion);
    EXPECT_EQ(h.from_rank, 0);
    EXPECT_EQ(h.to_rank, 1);
    EXPECT_EQ(h.comm_id, kCommId);
    EXPECT_EQ(h.sockets_per_peer, 2);
    // Not the token: a proof of it bound to the fixed part (the token never travels).
    std::string proof(h.token_bytes, '\0');
    ASSERT_TRUE(read_all(fd, &proof[0], proof.size()));
    EXPECT_EQ(proof.size(), braid::base::auth::kProofBytes);
    EXPECT_EQ(proof.find(kToken), std::string::npos);
    EXPECT_TRUE(braid::base::auth::verify(kToken, std::string(reinterpret_cast<const char*>(raw), sizeof raw),
                                          reinterpret_cast<const unsigned char*>(proof.data()), proof.size()));
    ASSERT_LT(h.socket_index, 2);
    ASSERT_EQ(socks[h.socket_index], -1);
    socks[h.socket_index] = fd;
  }
  auto read_part = [&](int fd, std::uint64_t seq, int index, std::uint64_t tag, std::uint64_t msg,
                       std::uint64_t part, const std::uint8_t* expected) {
    unsigned char raw[wire::kPartHeaderBytes];
    ASSERT_TRUE(read_all(fd, raw, sizeof raw));
    const wire::PartHeader h = wire::decode_part(raw);
    EXPECT_EQ(h.magic, wire::kPartMagic);
    EXPECT_EQ(h.seq, seq);
    EXPECT_EQ(h.part_index, index);
    EXPECT_EQ(h.tag, tag);
    EXPECT_EQ(h.msg_bytes, msg);
    ASSERT_EQ(h.part_bytes, part);
    std::vector<std::uint8_t> payload(part);
    ASSERT_TRUE(read_all(fd, payload.data(), payload.size()));
    EXPECT_EQ(std::memcmp(payload.data(), expected, part), 0);
  };
  // 256 KiB over 2 sockets: two 128 KiB halves; message #1 (1 byte) rotates to socket 1.
  read_part(socks[0], 0, 0, 11, big.size(), big.size() / 2, big.data());
  read_part(socks[1], 0, 1, 11, big.size(), big.size() / 2, big.data() + big.size() / 2);
  read_part(socks[1], 1, 0, 12, 1, 1, &small);
  checked = true;
  t0.join();
  for (int fd : socks) {
    if (fd >= 0) ::close(fd);
  }
  ::close(lfd);
}

// ---------------------------------------------------------------------------
// TLS (BRAID_TLS): the hello and answer in clear, then a TLS handshake per socket, then
// every part inside TLS records.

TEST(TcpTls, RanksExchangeMessagesOfEverySizeOverTls) {
  braid::test::TestPki pki;
  std::vector<std::shared_ptr<const braid::base::tls::Context>> ctx;
  for (int r = 0; r < 3; ++r)
    ctx.push_back(std::make_shared<const braid::base::tls::Context>(pki.member("rank" + std::to_string(r))));
  const auto make = [&](const bt::CommonOptions& c, bt::Poller& p, bt::PeerDirectory& d) {
    bt::TcpOptions o = options(c.rank, c.size, 2);
    o.tls = ctx[static_cast<std::size_t>(c.rank)];
    return bt::make_tcp_transport(o, p, d);
  };
  run_thread_ranks(
      3, [](int r) { return common_options(r, 3, kCommId); }, make,
      [](TransportRank& r) {
        const int next = (r.rank + 1) % 3, prev = (r.rank + 2) % 3;
        std::uint64_t tag = 1;
        for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{40}, std::size_t{4096},
                                    std::size_t{100000}, std::size_t{4} << 20}) {
          SCOPED_TRACE(n);
          const auto out = pattern(n, static_cast<std::uint64_t>(r.rank) * 1000 + n);
          const auto want = pattern(n, static_cast<std::uint64_t>(prev) * 1000 + n);
          std::vector<std::uint8_t> in(n);
          bt::Request s, q;
          r.to(next)->send(out.data(), n, tag, &s);
          r.to(prev)->recv(in.data(), n, tag, &q);
          ASSERT_TRUE(r.drive({&s, &q}));
          EXPECT_DONE(s);
          EXPECT_DONE(q);
          EXPECT_EQ(in, want);
          ++tag;
        }
      });
}

TEST(TcpTls, PartsTravelInsideTlsAfterTheHelloAndAnswer) {
  // A raw socket server plays rank 1: it checks the hello, answers, and only then can it
  // read rank 0's message, through its own TLS session with a certificate of the same CA.
  braid::test::TestPki pki;
  const braid::base::tls::Context mine(pki.member("rank1"));
  MemDirectory dir;
  const int lfd = listen_as_rank1(dir);
  ASSERT_GE(lfd, 0);
  const std::string message = "a gradient bucket that must travel encrypted";
  std::atomic<bool> done{false};
  std::thread t0([&] {
    bt::TcpOptions o = options(0, 2);
    o.tls = std::make_shared<const braid::base::tls::Context>(pki.member("rank0"));
    Rank r(dir, o);
    bt::Request s;
    r.to(1)->send(message.data(), message.size(), 9, &s);
    EXPECT_TRUE(r.drive({&s}));
    EXPECT_DONE(s);
    const auto deadline = Clock::now() + kDeadline;
    while (!done && Clock::now() < deadline) r.step();
  });
  pollfd pfd{lfd, POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, 10000), 1) << "rank 0 did not connect";
  const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK);
  ASSERT_GE(fd, 0);
  std::string hello(wire::kHelloBytes + braid::base::auth::kProofBytes, '\0');
  ASSERT_TRUE(read_all(fd, &hello[0], hello.size()));
  const std::string answer = braid::base::auth::prove(kToken, wire::answer_context(hello));
  ASSERT_TRUE(write_all(fd, answer.data(), answer.size()));
  // The next bytes are a TLS record (a ClientHello: handshake content type 22), not a part.
  unsigned char first = 0;
  pfd = pollfd{fd, POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, 10000), 1);
  ASSERT_EQ(::recv(fd, &first, 1, MSG_PEEK), 1);
  EXPECT_EQ(first, 22) << "rank 0 sent something other than a TLS handshake after the answer";
  braid::base::tls::Session tls(mine, fd, true);
  const auto deadline = Clock::now() + kDeadline;
  braid::base::tls::Session::Step step = tls.handshake();
  while (step != braid::base::tls::Session::Step::done && step != braid::base::tls::Session::Step::failed &&
         Clock::now() < deadline) {
    pollfd w{fd, static_cast<short>(step == braid::base::tls::Session::Step::want_write ? POLLOUT : POLLIN), 0};
    ::poll(&w, 1, 100);
    step = tls.handshake();
  }
  ASSERT_EQ(step, braid::base::tls::Session::Step::done) << tls.error();
  std::string got(wire::kPartHeaderBytes + message.size(), '\0');
  std::size_t have = 0;
  while (have < got.size() && Clock::now() < deadline) {
    const ssize_t r = tls.read(&got[have], got.size() - have);
    if (r > 0) {
      have += static_cast<std::size_t>(r);
    } else {
      ASSERT_TRUE(r < 0 && errno == EAGAIN) << "read: " << r << " " << tls.error();
      pollfd w{fd, POLLIN, 0};
      ::poll(&w, 1, 100);
    }
  }
  ASSERT_EQ(have, got.size());
  const wire::PartHeader h = wire::decode_part(reinterpret_cast<const unsigned char*>(got.data()));
  EXPECT_EQ(h.magic, wire::kPartMagic);
  EXPECT_EQ(h.tag, 9u);
  EXPECT_EQ(got.substr(wire::kPartHeaderBytes), message);
  done = true;
  t0.join();
  ::close(fd);
  ::close(lfd);
}

TEST(TcpTls, APeerWithoutTlsOrWithAStrangersCertificateGetsAClearError) {
  braid::test::TestPki pki;
  const auto member0 = std::make_shared<const braid::base::tls::Context>(pki.member("rank0"));
  const auto member1 = std::make_shared<const braid::base::tls::Context>(pki.member("rank1"));
  const auto stranger = std::make_shared<const braid::base::tls::Context>(pki.stranger());
  struct Case {
    const char* name;
    std::shared_ptr<const braid::base::tls::Context> tls0, tls1;
    int tls_rank;  // the rank whose error must name TLS
  };
  for (const Case& k : {Case{"rank 1 without TLS", member0, nullptr, 0}, Case{"rank 0 without TLS", nullptr, member1, 1},
                        Case{"rank 1 with a stranger's certificate", member0, stranger, 0}}) {
    SCOPED_TRACE(k.name);
    MemDirectory dir;
    bt::Request q0, q1;
    std::uint64_t a = 1, b = 0;
    auto run = [&](int rank, bt::Request* q) {
      bt::TcpOptions o = options(rank, 2);
      o.tls = rank == 0 ? k.tls0 : k.tls1;
      o.connect_timeout = 5s;
      Rank r(dir, o);
      if (rank == 0) {
        r.to(1)->send(&a, sizeof a, 3, q);
      } else {
        r.to(0)->recv(&b, sizeof b, 3, q);
      }
      EXPECT_TRUE(r.drive({q}, 20s)) << "a mismatch must end in an error, not a hang";
    };
    std::thread t1([&] { run(1, &q1); });
    run(0, &q0);
    t1.join();
    EXPECT_EQ(q1.state, State::failed) << "rank 1 received from a peer it could not authenticate";
    EXPECT_EQ(b, 0u);
    const bt::Request& named = k.tls_rank == 0 ? q0 : q1;
    EXPECT_EQ(named.state, State::failed);
    EXPECT_TRUE(contains(named.error, "TLS")) << named.error;
    EXPECT_TRUE(contains(named.error, k.tls_rank == 0 ? "rank 1" : "rank 0")) << named.error;
    // The rank without TLS is told that its peer speaks it.
    if (!k.tls1) {
      EXPECT_TRUE(contains(q1.error, "speaks TLS")) << q1.error;
    }
    if (!k.tls0) {
      EXPECT_TRUE(contains(q1.error, "rank 0 does not speak TLS")) << q1.error;
    }
  }
}

TEST(TcpTransport, InvalidOptionsAndPeersAreRejected) {
  MemDirectory dir;
  bt::Poller poller;
  RankDirectory d(dir, 0);
  auto o = options(0, 2);
  o.sockets_per_peer = 0;
  EXPECT_THROW(bt::make_tcp_transport(o, poller, d), braid::Error);
  o = options(2, 2);
  EXPECT_THROW(bt::make_tcp_transport(o, poller, d), braid::Error);
  o = options(0, 2);
  o.ifname = "no-such-interface0";
  EXPECT_THROW(bt::make_tcp_transport(o, poller, d), braid::Error);
  Rank r(dir, options(0, 2));
  EXPECT_THROW(r.to(0), braid::Error);
  EXPECT_THROW(r.to(2), braid::Error);
  EXPECT_THROW(r.to(1)->send(nullptr, 8, 1, nullptr), braid::Error);
}

// ---------------------------------------------------------------------------
// Address selection.

TEST(TcpSelectAddress, LoopbackMasterGivesLoopback) {
  EXPECT_EQ(bt::select_address("", "127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(bt::select_address("", "127.3.4.5"), "127.0.0.1");
  EXPECT_EQ(bt::select_address("", "localhost"), "127.0.0.1");
  EXPECT_EQ(bt::select_address("", ""), "127.0.0.1");
}

TEST(TcpSelectAddress, NamedInterface) {
  EXPECT_EQ(bt::select_address("lo", "10.1.2.3"), "127.0.0.1");
  try {
    bt::select_address("no-such-interface0", "");
    ADD_FAILURE() << "no exception";
  } catch (const braid::Error& e) {
    EXPECT_EQ(e.code(), braid::ErrorCode::InvalidUsage);
    EXPECT_TRUE(contains(e.what(), "no-such-interface0")) << e.what();
    EXPECT_TRUE(contains(e.what(), "lo (127.0.0.1)")) << e.what();
  }
}

TEST(TcpSelectAddress, RemoteMasterPicksAnInterfaceAddress) {
  const std::string a = bt::select_address("", "203.0.113.9");  // TEST-NET-3: no local subnet
  in_addr parsed{};
  EXPECT_EQ(::inet_pton(AF_INET, a.c_str(), &parsed), 1) << a;
}

// create_unique_id() under mpirun: no master address, yet other hosts must reach the
// store, so the first non-loopback interface (as for an unknown remote master), and
// 127.0.0.1 only on a machine that has nothing else.
TEST(TcpSelectAddress, PreferExternalWithoutMasterPicksLikeARemoteMaster) {
  EXPECT_EQ(bt::select_address("", "", true), bt::select_address("", "203.0.113.9"));
  EXPECT_EQ(bt::select_address("", "127.0.0.1", true), "127.0.0.1");  // an explicit loopback master stays
  EXPECT_EQ(bt::select_address("lo", "", true), "127.0.0.1");         // a named interface wins
}

}  // namespace
