// base/tls.hpp on real sockets (socketpairs, non-blocking): the handshake with
// certificates of one CA, data of every size through writev/readv, what the wire carries
// (never the plaintext), a record altered on the way, a stranger's certificate, a peer
// without TLS, and credentials that do not fit.
#include "base/tls.hpp"

#include "test_pki.hpp"
#include "test_support.hpp"

#include <braid/error.hpp>

#include <gtest/gtest.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace {

using braid::base::tls::Context;
using braid::base::tls::Files;
using braid::base::tls::Session;
using braid::test::TestPki;
using Clock = std::chrono::steady_clock;

struct SocketPair {
  SocketPair() {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) == 0) {
      a = fds[0];
      b = fds[1];
    }
  }
  ~SocketPair() {
    if (a >= 0) ::close(a);
    if (b >= 0) ::close(b);
  }
  int a = -1, b = -1;
};

/// Steps both handshakes until both are done or one fails (10 s at most).
bool handshake(Session& client, Session& server, std::string* why) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    const auto c = client.handshake();
    const auto s = server.handshake();
    if (c == Session::Step::failed) {
      *why = "client: " + client.error();
      return false;
    }
    if (s == Session::Step::failed) {
      *why = "server: " + server.error();
      return false;
    }
    if (c == Session::Step::done && s == Session::Step::done) return true;
  }
  *why = "no handshake within 10 s";
  return false;
}

/// Moves `n` bytes from `from` to `to` (writer and reader in one thread, non-blocking).
bool transfer(Session& from, Session& to, const std::vector<unsigned char>& data, std::vector<unsigned char>* got) {
  got->assign(data.size(), 0);
  std::size_t sent = 0, recvd = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (recvd < data.size() && Clock::now() < deadline) {
    if (sent < data.size()) {
      // Two pieces: a small "header" and the rest, as the transport writes them.
      const std::size_t first = std::min<std::size_t>(40, data.size() - sent);
      iovec iov[2] = {{const_cast<unsigned char*>(data.data() + sent), first},
                      {const_cast<unsigned char*>(data.data() + sent + first), data.size() - sent - first}};
      const ssize_t w = from.writev(iov, 2);
      if (w > 0) sent += static_cast<std::size_t>(w);
      else if (errno != EAGAIN) return false;
    }
    const std::size_t want = std::min<std::size_t>(data.size() - recvd, 100000);
    const ssize_t r = to.read(got->data() + recvd, want);
    if (r > 0) recvd += static_cast<std::size_t>(r);
    else if (r == 0 || errno != EAGAIN) return false;
  }
  return recvd == data.size();
}

struct Pair {
  explicit Pair(TestPki& pki, const Files& client_files, const Files& server_files)
      : client_ctx(client_files), server_ctx(server_files), client(client_ctx, sp.a, false),
        server(server_ctx, sp.b, true) {
    (void)pki;
  }
  SocketPair sp;
  Context client_ctx, server_ctx;
  Session client, server;
};

TEST(Tls, MutualHandshakeThenDataOfEverySizeBothWays) {
  TestPki pki;
  Pair p(pki, pki.member("rank0"), pki.member("rank1"));
  std::string why;
  ASSERT_TRUE(handshake(p.client, p.server, &why)) << why;
  EXPECT_NE(p.client.describe().find("TLSv1.3"), std::string::npos) << p.client.describe();
  EXPECT_NE(p.client.describe().find("CN=rank1"), std::string::npos) << p.client.describe();
  EXPECT_NE(p.server.describe().find("CN=rank0"), std::string::npos) << p.server.describe();
  for (const std::size_t n : {std::size_t{1}, std::size_t{40}, std::size_t{4096}, std::size_t{16384},
                              std::size_t{16385}, std::size_t{1} << 20, (std::size_t{3} << 20) + 7}) {
    SCOPED_TRACE(n);
    std::vector<unsigned char> data(n), got;
    for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<unsigned char>(i * 131 + 7);
    ASSERT_TRUE(transfer(p.client, p.server, data, &got)) << std::strerror(errno);
    EXPECT_EQ(got, data);
    ASSERT_TRUE(transfer(p.server, p.client, data, &got)) << std::strerror(errno);
    EXPECT_EQ(got, data);
  }
}

TEST(Tls, TheWireCarriesNoPlaintextAndAnAlteredRecordIsRefused) {
  TestPki pki;
  // client <-> [a|b] relay [c|d] <-> server: the test reads and edits what travels.
  SocketPair left, right;
  Context cc(pki.member("rank0")), sc(pki.member("rank1"));
  Session client(cc, left.a, false), server(sc, right.b, true);
  auto relay = [](int from, int to, bool flip, std::string* seen) {
    char buf[65536];
    const ssize_t r = ::recv(from, buf, sizeof buf, 0);
    if (r <= 0) return;
    if (seen) seen->append(buf, static_cast<std::size_t>(r));
    if (flip && r > 30) buf[r - 20] ^= 0x01;  // a bit inside the last record's ciphertext
    ASSERT_EQ(::send(to, buf, static_cast<std::size_t>(r), MSG_NOSIGNAL), r);
  };
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  bool up = false;
  while (!up && Clock::now() < deadline) {
    const auto c = client.handshake();
    relay(left.b, right.a, false, nullptr);
    const auto s = server.handshake();
    relay(right.a, left.b, false, nullptr);
    ASSERT_NE(c, Session::Step::failed) << client.error();
    ASSERT_NE(s, Session::Step::failed) << server.error();
    up = c == Session::Step::done && s == Session::Step::done;
  }
  ASSERT_TRUE(up);
  const std::string secret = "gradient bytes that must not be read on the wire: 0123456789";
  ASSERT_EQ(client.write(secret.data(), secret.size()), static_cast<ssize_t>(secret.size()));
  std::string wire;
  relay(left.b, right.a, false, &wire);
  EXPECT_GT(wire.size(), secret.size());
  EXPECT_EQ(wire.find("gradient bytes"), std::string::npos) << "plaintext on the wire";
  char got[128] = {};
  ASSERT_EQ(server.read(got, secret.size()), static_cast<ssize_t>(secret.size()));
  EXPECT_EQ(std::string(got, secret.size()), secret);
  // Now one bit flipped in transit: the reader refuses the record (EPROTO), never returns it.
  ASSERT_EQ(client.write(secret.data(), secret.size()), static_cast<ssize_t>(secret.size()));
  relay(left.b, right.a, true, nullptr);
  std::memset(got, 0, sizeof got);
  errno = 0;
  EXPECT_EQ(server.read(got, secret.size()), -1);
  EXPECT_EQ(errno, EPROTO);
  EXPECT_FALSE(server.error().empty());
  EXPECT_EQ(std::string(got, secret.size()).find("gradient"), std::string::npos);
}

TEST(Tls, AStrangersCertificateOrAPeerWithoutTlsIsRefused) {
  TestPki pki;
  {
    SCOPED_TRACE("client signed by another CA");
    Pair p(pki, pki.stranger(), pki.member("rank1"));
    std::string why;
    EXPECT_FALSE(handshake(p.client, p.server, &why));
    EXPECT_NE(why.find("server: the peer's certificate does not verify"), std::string::npos) << why;
  }
  {
    SCOPED_TRACE("server signed by another CA");
    Pair p(pki, pki.member("rank0"), pki.stranger());
    std::string why;
    EXPECT_FALSE(handshake(p.client, p.server, &why));
    EXPECT_NE(why.find("client: the peer's certificate does not verify"), std::string::npos) << why;
  }
  {
    SCOPED_TRACE("a peer that speaks no TLS");
    SocketPair sp;
    Context sc(pki.member("rank1"));
    Session server(sc, sp.b, true);
    const std::string plain = std::string(64, 'x');
    ASSERT_EQ(::send(sp.a, plain.data(), plain.size(), MSG_NOSIGNAL), 64);
    Session::Step s = Session::Step::want_read;
    for (int i = 0; i < 100 && s == Session::Step::want_read; ++i) s = server.handshake();
    EXPECT_EQ(s, Session::Step::failed);
    EXPECT_FALSE(server.error().empty());
  }
}

TEST(Tls, CredentialsThatDoNotFitAreClearErrors) {
  TestPki pki;
  const Files good = pki.member("rank0");
  const Files other = pki.member("rank1");
  auto message = [](const Files& f) {
    try {
      Context c(f);
    } catch (const braid::Error& e) {
      EXPECT_EQ(e.code(), braid::ErrorCode::InvalidUsage) << e.what();
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message({"", good.key, good.ca}).find("BRAID_TLS_CERT is not set"), std::string::npos);
  EXPECT_NE(message({good.cert, pki.dir() + "/missing.key", good.ca}).find("BRAID_TLS_KEY '"), std::string::npos);
  EXPECT_NE(message({good.cert, other.key, good.ca}).find("not the key of BRAID_TLS_CERT"), std::string::npos);
  const std::string junk = pki.dir() + "/junk.pem";
  std::ofstream(junk) << "not a certificate\n";
  EXPECT_NE(message({junk, good.key, good.ca}).find("is not a PEM certificate chain"), std::string::npos);
  EXPECT_NE(message({good.cert, good.key, junk}).find("is not a PEM CA bundle"), std::string::npos);
  EXPECT_EQ(message(good), "accepted");
}

}  // namespace
