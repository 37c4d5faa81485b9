// Store tests: the same semantics checked on every store kind (TcpStore with a
// standalone or an owned server, FileStore, PrefixStore over each), across threads
// and forked processes, plus what only one kind can get wrong: a TcpStore client that
// starts before its server, a server that dies under a blocked client, garbage on the
// wire, a FileStore file that is foreign, torn or re-created.
#include <braid/error.hpp>
#include <braid/store.hpp>

#include "core/store_wire.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

namespace braid {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string temp_path(const std::string& stem) {
  static std::atomic<int> n{0};
  return "/tmp/braid-test-" + stem + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

/// A temporary path, removed when this goes out of scope.
struct TempPath {
  explicit TempPath(const std::string& stem) : path(temp_path(stem)) {}
  ~TempPath() { ::unlink(path.c_str()); }
  TempPath(const TempPath&) = delete;
  TempPath& operator=(const TempPath&) = delete;
  std::string path;
};

long long ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count();
}

/// Runs fn on a thread; join() rethrows what it threw.
class Thread {
 public:
  explicit Thread(std::function<void()> fn)
      : t_([this, fn = std::move(fn)] {
          try {
            fn();
          } catch (...) {
            error_ = std::current_exception();
          }
        }) {}
  ~Thread() {
    if (t_.joinable()) t_.join();
  }
  void join() {
    t_.join();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::exception_ptr error_;
  std::thread t_;
};

/// Forks `n` children running fn(i); each exits 0 when fn returns and 1 when it
/// throws. Fails the test for every child that does not exit 0 within `timeout`.
void run_forked(int n, const std::function<void(int)>& fn, std::chrono::seconds timeout = 60s) {
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    std::fflush(nullptr);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0) << "fork failed: " << std::strerror(errno);
    if (pid == 0) {
      int rc = 0;
      try {
        fn(i);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child %d: %s\n", i, e.what());
        rc = 1;
      }
      ::_exit(rc);  // never run the parent's destructors or gtest's atexit handlers
    }
    pids.push_back(pid);
  }
  auto deadline = Clock::now() + timeout;
  for (int i = 0; i < n; ++i) {
    int status = 0;
    pid_t r;
    while ((r = ::waitpid(pids[i], &status, WNOHANG)) == 0 && Clock::now() < deadline)
      std::this_thread::sleep_for(5ms);
    if (r == 0) {
      ::kill(pids[i], SIGKILL);
      ::waitpid(pids[i], &status, 0);
      ADD_FAILURE() << "child " << i << " did not finish within " << timeout.count() << " s";
      continue;
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "child " << i << " failed (status " << status << ")";
  }
}

// ---------------------------------------------------------------------------
// One store, and more clients of it.

class Backend {
 public:
  virtual ~Backend() = default;
  /// A client of the store (a new one per call, except where noted).
  virtual std::shared_ptr<Store> open() = 0;
  /// What timeout messages must name (address or path).
  virtual std::string where() const = 0;
};

class TcpBackend : public Backend {
 public:
  TcpBackend() : server_(std::make_unique<TcpStoreServer>("127.0.0.1", 0)) {}
  std::shared_ptr<Store> open() override {
    return std::make_shared<TcpStore>("127.0.0.1", server_->port(), false, 10s);
  }
  std::string where() const override { return "127.0.0.1:" + std::to_string(server_->port()); }

 private:
  std::unique_ptr<TcpStoreServer> server_;
};

/// A TcpStore that hosts its own server; the first open() returns it.
class TcpOwnedBackend : public Backend {
 public:
  TcpOwnedBackend() : owner_(std::make_shared<TcpStore>("127.0.0.1", 0, true, 10s)) {}
  std::shared_ptr<Store> open() override {
    if (!handed_out_) {
      handed_out_ = true;
      return owner_;
    }
    return std::make_shared<TcpStore>("127.0.0.1", owner_->port(), false, 10s);
  }
  std::string where() const override { return "127.0.0.1:" + std::to_string(owner_->port()); }

 private:
  std::shared_ptr<TcpStore> owner_;
  bool handed_out_ = false;
};

class FileBackend : public Backend {
 public:
  std::shared_ptr<Store> open() override { return std::make_shared<FileStore>(file_.path); }
  std::string where() const override { return file_.path; }

 private:
  TempPath file_{"filestore"};
};

class PrefixBackend : public Backend {
 public:
  explicit PrefixBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::shared_ptr<Store> open() override {
    return std::make_shared<PrefixStore>("job7", inner_->open());
  }
  std::string where() const override { return inner_->where(); }

 private:
  std::unique_ptr<Backend> inner_;
};

std::unique_ptr<Backend> make_backend(const std::string& kind) {
  if (kind == "tcp") return std::make_unique<TcpBackend>();
  if (kind == "tcp_owned") return std::make_unique<TcpOwnedBackend>();
  if (kind == "file") return std::make_unique<FileBackend>();
  if (kind == "prefix_tcp") return std::make_unique<PrefixBackend>(std::make_unique<TcpBackend>());
  if (kind == "prefix_file")
    return std::make_unique<PrefixBackend>(std::make_unique<FileBackend>());
  throw std::logic_error("unknown store kind " + kind);
}

class StoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = make_backend(GetParam());
    store_ = backend_->open();
  }
  std::unique_ptr<Backend> backend_;
  std::shared_ptr<Store> store_;
};

TEST_P(StoreTest, SetThenGetSeesLatestValueFromAnyClient) {
  store_->set("k", "v1");
  EXPECT_EQ(store_->get("k", 1s), "v1");
  store_->set("k", "v2");
  EXPECT_EQ(store_->get("k", 1s), "v2");
  auto other = backend_->open();
  EXPECT_EQ(other->get("k", 1s), "v2");
  other->set("k", "");
  EXPECT_EQ(store_->get("k", 1s), "");
}

TEST_P(StoreTest, GetWaitsForASetFromAnotherThread) {
  auto t0 = Clock::now();
  Thread setter([&] {
    auto mine = backend_->open();
    std::this_thread::sleep_for(150ms);
    mine->set("late", "here");
  });
  EXPECT_EQ(store_->get("late", 20s), "here");
  EXPECT_GE(ms_since(t0), 100);  // it really waited for the set
  setter.join();
}

// One client object shared by two threads: a blocked get must not hold up the
// other thread's requests (it would deadlock here until the timeout).
TEST_P(StoreTest, OneClientSharedByABlockedGetterAndASetter) {
  Thread getter([&] { EXPECT_EQ(store_->get("x", 20s), "42"); });
  std::this_thread::sleep_for(100ms);
  auto t0 = Clock::now();
  store_->set("y", "1");
  EXPECT_EQ(store_->get("y", 1s), "1");
  EXPECT_EQ(store_->add("n", 1), 1);
  EXPECT_LT(ms_since(t0), 2000);
  store_->set("x", "42");
  getter.join();
}

TEST_P(StoreTest, GetTimeoutThrowsTimeoutErrorNamingKeyAndStore) {
  auto t0 = Clock::now();
  try {
    store_->get("missing-key", 300ms);
    FAIL() << "get of a key nobody sets returned";
  } catch (const TimeoutError& e) {
    auto ms = ms_since(t0);
    EXPECT_GE(ms, 290);
    EXPECT_LT(ms, 3000);
    EXPECT_EQ(e.code(), ErrorCode::Timeout);
    std::string what = e.what();
    EXPECT_NE(what.find("missing-key"), std::string::npos) << what;
    EXPECT_NE(what.find(backend_->where()), std::string::npos) << what;
    EXPECT_NE(what.find("300 ms"), std::string::npos) << what;
  }
  // The client is still usable after a timeout.
  store_->set("after", "ok");
  EXPECT_EQ(store_->get("after", 1s), "ok");
  EXPECT_THROW(store_->get("missing-key", 0ms), TimeoutError);
}

TEST_P(StoreTest, AddFromManyThreadsSumsAndReturnsDistinctValues) {
  constexpr int kThreads = 8, kAdds = 150;
  std::vector<std::vector<std::int64_t>> seen(kThreads);
  std::vector<std::unique_ptr<Thread>> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.push_back(std::make_unique<Thread>([&, t] {
      // Half share the fixture's client, half have their own.
      auto s = t % 2 ? backend_->open() : store_;
      for (int i = 0; i < kAdds; ++i) seen[t].push_back(s->add("counter", 1));
    }));
  }
  for (auto& t : threads) t->join();
  EXPECT_EQ(store_->add("counter", 0), kThreads * kAdds);
  std::vector<std::int64_t> all;
  for (auto& v : seen) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  std::vector<std::int64_t> expect(all.size());
  std::iota(expect.begin(), expect.end(), 1);
  EXPECT_EQ(all, expect) << "every add must see a distinct intermediate value";
  EXPECT_EQ(store_->get("counter", 1s), std::to_string(kThreads * kAdds));
  EXPECT_EQ(store_->add("neg", -5), -5);
  EXPECT_EQ(store_->add("neg", 2), -3);
}

TEST_P(StoreTest, AddFromForkedProcessesSums) {
  constexpr int kProcs = 4, kAdds = 100;
  run_forked(kProcs, [&](int rank) {
    auto s = backend_->open();  // a client of its own in each child
    for (int i = 0; i < kAdds; ++i) s->add("counter", 1);
    s->set("done/" + std::to_string(rank), "1");
  });
  std::vector<std::string> done;
  for (int r = 0; r < kProcs; ++r) done.push_back("done/" + std::to_string(r));
  store_->wait(done, 5s);
  EXPECT_EQ(store_->add("counter", 0), kProcs * kAdds);
}

// The agreement primitive of Communicator::shrink(): of many racing first writers exactly
// one wins, every caller is told the winner, and a later mismatch changes nothing.
TEST_P(StoreTest, CompareSetHasOneWinnerThatEveryCallerSees) {
  constexpr int kThreads = 8;
  std::vector<std::string> saw(kThreads);
  std::vector<std::unique_ptr<Thread>> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.push_back(std::make_unique<Thread>([&, t] {
      auto s = t % 2 ? backend_->open() : store_;
      saw[t] = s->compare_set("decision", "", "from " + std::to_string(t));
    }));
  for (auto& t : threads) t->join();
  const std::string won = store_->get("decision", 1s);
  EXPECT_EQ(won.rfind("from ", 0), 0u) << won;
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(saw[t], won) << "caller " << t << " was told another winner";
  EXPECT_EQ(store_->compare_set("decision", "not it", "x"), won);  // mismatch: unchanged
  EXPECT_EQ(store_->compare_set("decision", won, "next"), "next");  // match: replaced
  EXPECT_EQ(store_->get("decision", 1s), "next");
  EXPECT_EQ(store_->compare_set("absent", "something", "x"), "");  // a missing key matches only ""
  EXPECT_FALSE(store_->check({"absent"}));
  EXPECT_EQ(store_->compare_set("bin", "", std::string("a\0b", 3)), std::string("a\0b", 3));
}

TEST_P(StoreTest, CheckAndWait) {
  EXPECT_TRUE(store_->check({}));
  store_->wait({}, 0ms);
  EXPECT_FALSE(store_->check({"a"}));
  store_->set("a", "1");
  EXPECT_TRUE(store_->check({"a"}));
  EXPECT_FALSE(store_->check({"a", "b"}));
  auto t0 = Clock::now();
  try {
    store_->wait({"a", "b"}, 200ms);
    FAIL() << "wait for a key nobody sets returned";
  } catch (const TimeoutError& e) {
    EXPECT_GE(ms_since(t0), 190);
    std::string what = e.what();
    EXPECT_NE(what.find("b'"), std::string::npos) << what;
    EXPECT_EQ(what.find("a'"), std::string::npos) << "names only the missing key: " << what;
  }
  Thread setter([&] {
    auto mine = backend_->open();
    std::this_thread::sleep_for(100ms);
    mine->set("b", "2");
  });
  store_->wait({"a", "b"}, 20s);
  EXPECT_TRUE(store_->check({"a", "b"}));
  setter.join();
}

TEST_P(StoreTest, RemoveDeletesAndReportsExistence) {
  EXPECT_FALSE(store_->remove("r"));
  store_->set("r", "x");
  EXPECT_TRUE(store_->remove("r"));
  EXPECT_FALSE(store_->remove("r"));
  EXPECT_FALSE(store_->check({"r"}));
  EXPECT_THROW(store_->get("r", 50ms), TimeoutError);
  EXPECT_FALSE(backend_->open()->check({"r"}));
  EXPECT_EQ(store_->add("r", 5), 5) << "a removed counter restarts from 0";
}

TEST_P(StoreTest, BinaryKeysAndValuesRoundTrip) {
  std::string value;
  for (int rep = 0; rep < 3; ++rep)
    for (int c = 0; c < 256; ++c) value.push_back(static_cast<char>(c));
  value += std::string(5, '\0');
  std::string key("bin\0key\xff", 8);
  store_->set(key, value);
  auto other = backend_->open();
  EXPECT_EQ(other->get(key, 1s), value);
  EXPECT_FALSE(other->check({std::string("bin")})) << "the key must not be cut at the NUL";
  std::string big(1 << 20, '\0');
  for (std::size_t i = 0; i < big.size(); i += 7) big[i] = static_cast<char>(i);
  store_->set("big", big);
  EXPECT_EQ(other->get("big", 5s), big);
}

TEST_P(StoreTest, AddRejectsNonIntegersAndOverflow) {
  store_->set("text", "12abc");
  try {
    store_->add("text", 1);
    FAIL() << "add on a non-integer value returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
  }
  EXPECT_EQ(store_->get("text", 1s), "12abc");
  store_->set("max", std::to_string(std::numeric_limits<std::int64_t>::max()));
  EXPECT_THROW(store_->add("max", 1), Error);
  store_->set("n", "-7");
  EXPECT_EQ(store_->add("n", 10), 3);
}

TEST_P(StoreTest, OversizedKeyIsInvalidUsage) {
  try {
    store_->set(std::string(5000, 'k'), "v");
    FAIL() << "a 5000-byte key was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
  }
  store_->set("fine", "v");  // the store still works
  EXPECT_EQ(store_->get("fine", 1s), "v");
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreTest,
                         ::testing::Values("tcp", "tcp_owned", "file", "prefix_tcp", "prefix_file"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           return p.param;
                         });

// ---------------------------------------------------------------------------
// PrefixStore.

class PrefixStoreTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PrefixStoreTest, NamespacesAreIsolatedAndMapToPrefixSlashKey) {
  auto backend = make_backend(GetParam());
  std::shared_ptr<Store> base = backend->open();
  PrefixStore a("a", base), b("b", base);
  a.set("k", "from-a");
  EXPECT_FALSE(b.check({"k"}));
  EXPECT_THROW(b.get("k", 50ms), TimeoutError);
  EXPECT_EQ(base->get("a/k", 1s), "from-a");
  base->set("b/k", "from-b");
  EXPECT_EQ(b.get("k", 1s), "from-b");
  EXPECT_EQ(a.get("k", 1s), "from-a");
  EXPECT_EQ(a.add("n", 5), 5);
  EXPECT_EQ(b.add("n", 1), 1);
  EXPECT_EQ(base->add("a/n", 0), 5);
  b.wait({"k", "n"}, 1s);
  EXPECT_TRUE(a.remove("k"));
  EXPECT_TRUE(b.check({"k"}));
  PrefixStore nested("x", std::make_shared<PrefixStore>("y", base));
  nested.set("z", "1");
  EXPECT_TRUE(base->check({"y/x/z"}));
}

TEST_P(PrefixStoreTest, KeepsItsBaseAlive) {
  auto backend = make_backend(GetParam());
  std::shared_ptr<Store> base = backend->open();
  std::weak_ptr<Store> weak = base;
  std::string where = backend->where();
  auto p = std::make_unique<PrefixStore>("p", std::move(base));
  backend.reset();  // drops the backend's references (a server stays up with tcp_owned)
  EXPECT_FALSE(weak.expired());
  p->set("k", "v");
  EXPECT_EQ(p->get("k", 1s), "v");
  p.reset();
  EXPECT_TRUE(weak.expired());
  if (GetParam() == "file") ::unlink(where.c_str());  // re-created by the set above
}

INSTANTIATE_TEST_SUITE_P(Bases, PrefixStoreTest, ::testing::Values("tcp_owned", "file"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           return p.param;
                         });

TEST(PrefixStore, NullBaseIsInvalidUsage) {
  try {
    PrefixStore p("p", nullptr);
    FAIL() << "a null base was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
  }
}

// ---------------------------------------------------------------------------
// TcpStore.

/// A port that was free a moment ago.
std::uint16_t free_port() {
  TcpStoreServer probe("127.0.0.1", 0);
  return probe.port();
}

/// A raw TCP connection to 127.0.0.1:port.
int raw_connect(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ADD_FAILURE() << "raw connect failed: " << std::strerror(errno);
  }
  return fd;
}

void raw_send(int fd, const std::string& bytes) {
  ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
}

/// Reads until EOF or `timeout`; true when the peer closed the connection.
bool closed_by_peer(int fd, milliseconds timeout, std::string* got = nullptr) {
  auto deadline = Clock::now() + timeout;
  char buf[4096];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    ssize_t r = ::recv(fd, buf, sizeof buf, 0);
    if (r == 0 || (r < 0 && errno == ECONNRESET)) return true;
    if (r > 0 && got) got->append(buf, static_cast<std::size_t>(r));
  }
  return false;
}

std::string le32(std::uint32_t v) {
  std::string s;
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

// Protocol version 3: a client's hello without a token (its nonce: 16 bytes), and the
// server's answers.
const std::string kNonce(16, 'n');
const std::string kHello = std::string("BRDS") + std::string("\x03\x00\x00\x00", 4) + kNonce;
const std::string kAccepted = std::string("BRDS") + std::string("\x03\x00\x00\x00", 4);
const std::string kRefusedAnswer = std::string("BRDS") + std::string("\x03\x00\x01\x00", 4);
const std::string kChallengeHead = std::string("BRDS") + std::string("\x03\x00\x02\x00", 4);
const std::string kHelloWithToken = std::string("BRDS") + std::string("\x03\x00\x01\x00", 4) + kNonce;

TEST(TcpStore, ClientStartedBeforeServerConnectsWhenItAppears) {
  std::uint16_t port = free_port();
  std::string got;
  Thread client([&] {
    TcpStore early("127.0.0.1", port, false, 20s);
    got = early.get("k", 20s);
  });
  std::this_thread::sleep_for(400ms);
  TcpStoreServer server("127.0.0.1", port);
  TcpStore late("127.0.0.1", port, false, 5s);
  late.set("k", "hello");
  client.join();
  EXPECT_EQ(got, "hello");
}

TEST(TcpStore, ConnectGivesUpAtConnectTimeoutNamingTheAddress) {
  std::uint16_t port = free_port();
  auto t0 = Clock::now();
  try {
    TcpStore s("127.0.0.1", port, false, 300ms);
    FAIL() << "connected to a port nobody listens on";
  } catch (const TimeoutError& e) {
    EXPECT_GE(ms_since(t0), 250);
    EXPECT_LT(ms_since(t0), 3000);
    EXPECT_NE(std::string(e.what()).find(std::to_string(port)), std::string::npos) << e.what();
  }
}

TEST(TcpStore, ServerDestructionFailsABlockedGetWithNetworkError) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  TcpStore client("127.0.0.1", server->port(), false, 5s);
  client.set("warm", "up");
  std::atomic<int> code{0};
  auto t0 = Clock::now();
  Thread blocked([&] {
    try {
      client.get("never-set", 60s);
    } catch (const Error& e) {
      code = static_cast<int>(e.code());
    }
  });
  std::this_thread::sleep_for(200ms);
  server.reset();
  blocked.join();
  EXPECT_LT(ms_since(t0), 10000) << "the client must notice the dead server, not wait 60 s";
  EXPECT_EQ(code.load(), static_cast<int>(ErrorCode::Network));
  try {
    client.set("after", "x");
    FAIL() << "a client of a dead server accepted a set";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Network);
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:"), std::string::npos) << e.what();
  }
}

TEST(TcpStore, GarbageFromRawClientsDoesNotHurtTheServer) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStore good("127.0.0.1", server.port(), false, 5s);
  good.set("k", "v");
  Thread waiter([&] {
    TcpStore mine("127.0.0.1", server.port(), false, 5s);
    EXPECT_EQ(mine.get("later", 30s), "set after the garbage");
  });

  // Each of these must make the server close that connection, and only that one.
  std::vector<std::pair<std::string, std::string>> garbage = {
      {"bad magic", "GET / HTTP/1.0\r\n\r\n"},
      {"bad version", std::string("BRDS\x07\x00\x00\x00", 8)},
      {"version 1 (before tokens)", std::string("BRDS\x01\x00\x00\x00", 8)},
      {"version 2 (tokens in clear)", std::string("BRDS\x02\x00\x05\x00", 8) + "token"},
      {"unknown flags", std::string("BRDS\x03\x00\x06\x00", 8) + kNonce},
      {"huge frame length", kHello + le32(0xffffffffu)},
      {"zero frame length", kHello + le32(0)},
      {"unknown op", kHello + le32(5) + std::string("\x63\x01\x00\x00\x00", 5)},
      // SET whose key length claims more bytes than the frame holds.
      {"key past frame end",
       kHello + le32(13) + std::string("\x01\x01\x00\x00\x00", 5) + le32(1000) + "abcd"},
      // GET of a 5000-byte key (over the 4 KiB cap).
      {"oversized key", kHello + le32(5 + 4 + 5000 + 8) + std::string("\x02\x01\x00\x00\x00", 5) +
                            le32(5000) + std::string(5000, 'k') + std::string(8, '\0')},
      // CHECK claiming 2^32-1 keys.
      {"key count", kHello + le32(9) + std::string("\x04\x01\x00\x00\x00", 5) + le32(0xffffffffu)},
      // Trailing bytes after a complete REMOVE.
      {"trailing bytes",
       kHello + le32(11) + std::string("\x06\x01\x00\x00\x00", 5) + le32(1) + "kk"},
  };
  for (const auto& [name, bytes] : garbage) {
    int fd = raw_connect(server.port());
    raw_send(fd, bytes);
    EXPECT_TRUE(closed_by_peer(fd, 5s)) << "server kept a connection that sent " << name;
    ::close(fd);
    EXPECT_EQ(good.get("k", 1s), "v") << "after " << name;
  }
  // A client that vanishes halfway through a frame, and one that sends random bytes.
  int fd = raw_connect(server.port());
  raw_send(fd, kHello + le32(100) + "abc");
  ::close(fd);
  fd = raw_connect(server.port());
  std::string noise;
  for (int i = 0; i < 100000; ++i) noise.push_back(static_cast<char>((i * 7919) ^ (i >> 3)));
  ::send(fd, noise.data(), noise.size(), MSG_NOSIGNAL);
  EXPECT_TRUE(closed_by_peer(fd, 5s));
  ::close(fd);

  // The raw protocol is understood when it is right: hello, then SET "later".
  fd = raw_connect(server.port());
  std::string value = "set after the garbage";
  raw_send(fd, kHello + le32(5 + 4 + 5 + 4 + static_cast<std::uint32_t>(value.size())) +
                   std::string("\x01\x09\x00\x00\x00", 5) + le32(5) + "later" +
                   le32(static_cast<std::uint32_t>(value.size())) + value);
  std::string reply;
  EXPECT_FALSE(closed_by_peer(fd, 300ms, &reply));
  EXPECT_EQ(reply, kAccepted + le32(5) + std::string("\x00\x09\x00\x00\x00", 5));
  ::close(fd);

  waiter.join();
  TcpStore fresh("127.0.0.1", server.port(), false, 5s);
  EXPECT_EQ(fresh.get("k", 1s), "v");
}

// A server given a token serves only clients that prove they know it, and proves it
// first: a client without a token is refused; one with another token refuses the server
// (which cannot prove it knows that one); the job's clients are not disturbed.
TEST(TcpStore, ServerWithATokenRefusesClientsWithoutIt) {
  const std::string token = "job-4711-secret";
  TcpStoreServer server("127.0.0.1", 0, token);
  TcpStore good("127.0.0.1", server.port(), false, 5s, token);
  good.set("k", "v");
  for (const std::string& bad : {std::string(), std::string("job-4711-secreT"), token + "x", token.substr(1)}) {
    SCOPED_TRACE("presented '" + bad + "'");
    try {
      TcpStore stranger("127.0.0.1", server.port(), false, 5s, bad);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
      const std::string what = e.what();
      EXPECT_NE(what.find(bad.empty() ? "refused this client" : "does not know the token this client has"),
                std::string::npos)
          << what;
    }
    EXPECT_EQ(good.get("k", 1s), "v");
  }
  // Raw: a hello without a token gets the refusal, then the connection closes; requests
  // sent behind it are never served.
  int fd = raw_connect(server.port());
  raw_send(fd, kHello + le32(5 + 4 + 1 + 4 + 1) + std::string("\x01\x09\x00\x00\x00", 5) + le32(1) + "x" + le32(1) +
                   "y");
  std::string reply;
  EXPECT_TRUE(closed_by_peer(fd, 5s, &reply));
  EXPECT_EQ(reply, kRefusedAnswer);
  ::close(fd);
  EXPECT_FALSE(good.check({"x"})) << "a refused client's SET was served";
  // An owned server (is_server) takes the token too.
  TcpStore owner("127.0.0.1", 0, true, 5s, token);
  EXPECT_THROW(TcpStore("127.0.0.1", owner.port(), false, 2s), Error);
  TcpStore peer("127.0.0.1", owner.port(), false, 5s, token);
  peer.set("a", "b");
  EXPECT_EQ(owner.get("a", 1s), "b");
}

// The handshake is mutual and fresh: the server proves it knows the token before the
// client does (so a client never talks to a squatter), the token is never on the wire,
// and a recorded client proof is refused on another connection (the server's nonce
// differs).
TEST(TcpStore, HandshakeIsMutualAndARecordedProofIsRefused) {
  namespace sw = braid::core::store_wire;
  const std::string token = "job-4711-secret";
  TcpStoreServer server("127.0.0.1", 0, token);
  // A client with a token refuses a server without one: it cannot tell it from a squatter.
  TcpStoreServer open("127.0.0.1", 0);
  try {
    TcpStore wary("127.0.0.1", open.port(), false, 5s, token);
    ADD_FAILURE() << "a client with a token used a server that asked for none";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
    EXPECT_NE(std::string(e.what()).find("without asking for the job's token"), std::string::npos) << e.what();
  }
  auto challenge = [&](int fd) {
    raw_send(fd, kHelloWithToken);
    std::string got;
    const auto deadline = Clock::now() + 5s;
    char buf[256];
    while (got.size() < sw::kChallengeSize && Clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const ssize_t r = ::recv(fd, buf, sizeof buf, 0);
      if (r <= 0) break;
      got.append(buf, static_cast<std::size_t>(r));
    }
    return got;
  };
  int fd = raw_connect(server.port());
  const std::string c1 = challenge(fd);
  ASSERT_EQ(c1.size(), sw::kChallengeSize);
  EXPECT_EQ(c1.substr(0, 8), kChallengeHead);
  const std::string ns1 = c1.substr(8, 16);
  EXPECT_EQ(c1.substr(24), sw::server_proof(token, kNonce, ns1)) << "the server's proof";
  EXPECT_EQ(c1.find(token), std::string::npos) << "the token travelled";
  const std::string proof = sw::client_proof(token, kNonce, ns1);
  raw_send(fd, proof);
  std::string reply;
  EXPECT_FALSE(closed_by_peer(fd, 300ms, &reply));
  EXPECT_EQ(reply, kAccepted);
  ::close(fd);
  // The same hello and the recorded proof on a new connection: refused.
  fd = raw_connect(server.port());
  const std::string c2 = challenge(fd);
  ASSERT_EQ(c2.size(), sw::kChallengeSize);
  EXPECT_NE(c2.substr(8, 16), ns1) << "the server reused its nonce";
  raw_send(fd, proof + le32(5 + 4 + 1 + 4 + 1) + std::string("\x01\x09\x00\x00\x00", 5) + le32(1) + "x" + le32(1) +
                   "y");
  reply.clear();
  EXPECT_TRUE(closed_by_peer(fd, 5s, &reply));
  EXPECT_EQ(reply, kRefusedAnswer);
  ::close(fd);
  TcpStore good("127.0.0.1", server.port(), false, 5s, token);
  EXPECT_FALSE(good.check({"x"})) << "a replayed client's SET was served";
}

// The limits, in a process of its own (the configuration is read once per process): run
// by StoreLimits.AreEnforcedWithClearErrors with BRAID_STORE_* set small.
TEST(StoreLimitsChild, DISABLED_Enforced) {
  TcpStoreServer server("127.0.0.1", 0);
  // Hello deadline: a silent connection is closed after BRAID_STORE_HELLO_TIMEOUT (1 s).
  const auto t0 = Clock::now();
  int silent = raw_connect(server.port());
  EXPECT_TRUE(closed_by_peer(silent, 5s)) << "a connection that never said hello was kept";
  EXPECT_GE(Clock::now() - t0, 800ms);
  ::close(silent);
  // Pending cap (4): four silent connections hold every handshake slot; a fifth is
  // refused at once, and the first four are not evicted for it.
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) held.push_back(raw_connect(server.port()));
  std::this_thread::sleep_for(100ms);
  int fifth = raw_connect(server.port());
  EXPECT_TRUE(closed_by_peer(fifth, 500ms)) << "a connection beyond BRAID_STORE_MAX_PENDING was kept";
  ::close(fifth);
  // The held ones still get their handshake answered.
  raw_send(held[0], kHello);
  std::string reply;
  EXPECT_FALSE(closed_by_peer(held[0], 300ms, &reply));
  EXPECT_EQ(reply, kAccepted);
  for (int fd : held) ::close(fd);
  std::this_thread::sleep_for(200ms);
  // Keys (8) and bytes (4096): a clear error naming the row; existing keys still update.
  TcpStore client("127.0.0.1", server.port(), false, 5s);
  for (int i = 0; i < 8; ++i) client.set("k" + std::to_string(i), "v");
  try {
    client.set("one-too-many", "v");
    ADD_FAILURE() << "a key beyond BRAID_STORE_MAX_KEYS was stored";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
    EXPECT_NE(std::string(e.what()).find("BRAID_STORE_MAX_KEYS"), std::string::npos) << e.what();
  }
  EXPECT_THROW(client.add("counter", 1), Error);
  client.set("k0", "updated");
  EXPECT_EQ(client.get("k0", 1s), "updated");
  try {
    client.set("k1", std::string(5000, 'x'));
    ADD_FAILURE() << "a value beyond BRAID_STORE_MAX_BYTES was stored";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("BRAID_STORE_MAX_BYTES"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(client.remove("k2"));
  client.set("new", "v");  // room again after a remove
  EXPECT_EQ(client.get("new", 1s), "v");
  // Blocked requests per client (2): a third closes that client, so every call it has
  // pending fails at once with the lost connection, not at its 5 s timeout.
  TcpStore waiter("127.0.0.1", server.port(), false, 5s);
  std::atomic<int> lost{0};
  const auto w0 = Clock::now();
  std::vector<std::thread> gets;
  for (int i = 0; i < 3; ++i)
    gets.emplace_back([&, i] {
      try {
        waiter.get("never-" + std::to_string(i), 5s);
      } catch (const Error& e) {
        if (e.code() == ErrorCode::Network) ++lost;
      }
    });
  for (auto& t : gets) t.join();
  EXPECT_EQ(lost.load(), 3);
  EXPECT_LT(Clock::now() - w0, 3s);
  EXPECT_EQ(client.get("new", 1s), "v") << "the other client was disturbed";
}

TEST(StoreLimits, AreEnforcedWithClearErrors) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setenv("BRAID_STORE_HELLO_TIMEOUT", "1s", 1);
    ::setenv("BRAID_STORE_MAX_PENDING", "4", 1);
    ::setenv("BRAID_STORE_MAX_KEYS", "8", 1);
    ::setenv("BRAID_STORE_MAX_BYTES", "4096", 1);
    ::setenv("BRAID_STORE_MAX_WAITS", "2", 1);
    ::execl("/proc/self/exe", "test_store", "--gtest_filter=StoreLimitsChild.DISABLED_Enforced",
            "--gtest_also_run_disabled_tests", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the limits test failed in the child (its output is above)";
}

/// Whether a TCP connect to `ip`:`port` succeeds.
bool connects(const char* ip, std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  ::inet_pton(AF_INET, ip, &sa.sin_addr);
  const bool ok = fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  if (fd >= 0) ::close(fd);
  return ok;
}

// A hosted store (TcpStore with is_server, as rank 0 makes it) listens on the address its
// clients were given, not on every interface: 127.0.0.2 is this host too, but nobody was
// told it. (Every 127/8 address is local on Linux, so a 0.0.0.0 listener would answer.)
TEST(TcpStore, HostedServerListensOnlyWhereAsked) {
  TcpStore owner("127.0.0.1", 0, true, 5s);
  EXPECT_TRUE(connects("127.0.0.1", owner.port()));
  EXPECT_FALSE(connects("127.0.0.2", owner.port())) << "the store listens beyond the address it was given";
  // A name resolves to its addresses ("localhost": loopback only).
  TcpStore named("localhost", 0, true, 5s);
  EXPECT_TRUE(connects("127.0.0.1", named.port()));
  EXPECT_FALSE(connects("127.0.0.2", named.port()));
  // Several addresses, one port: the server's list form.
  TcpStoreServer both("127.0.0.1,127.0.0.3", 0);
  EXPECT_TRUE(connects("127.0.0.1", both.port()));
  EXPECT_TRUE(connects("127.0.0.3", both.port()));
  EXPECT_FALSE(connects("127.0.0.2", both.port()));
  // Rank 0 reaches its own store at an address other than 127.0.0.1 (a master address on a
  // NIC, as under srun across nodes): the owner connects where the server listens.
  TcpStore other("127.0.0.2", 0, true, 5s);
  other.set("k", "v");
  EXPECT_EQ(other.get("k", 5s), "v");
  EXPECT_TRUE(connects("127.0.0.2", other.port()));
  EXPECT_FALSE(connects("127.0.0.1", other.port()));
  // An address that is not this host's is refused with a hint.
  try {
    TcpStoreServer elsewhere("192.0.2.1", 0);
    ADD_FAILURE() << "bound an address of another host";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("BRAID_STORE_BIND"), std::string::npos) << e.what();
  }
}

TEST(TcpStore, BindFailureIsNetworkErrorNamingAddressPortAndReason) {
  TcpStoreServer first("127.0.0.1", 0);
  try {
    TcpStoreServer second("127.0.0.1", first.port());
    FAIL() << "two servers bound one port";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Network);
    std::string what = e.what();
    EXPECT_NE(what.find("127.0.0.1:" + std::to_string(first.port())), std::string::npos) << what;
    EXPECT_NE(what.find(std::strerror(EADDRINUSE)), std::string::npos) << what;
  }
  try {
    TcpStoreServer bad("256.0.0.1", 0);
    FAIL() << "bound an invalid address";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Network);
    EXPECT_NE(std::string(e.what()).find("256.0.0.1"), std::string::npos) << e.what();
  }
}

TEST(TcpStore, NonStoreServerFailsTheHandshake) {
  int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(::listen(lfd, 4), 0);
  socklen_t len = sizeof sa;
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&sa), &len);
  Thread impostor([&] {
    int c = ::accept(lfd, nullptr, nullptr);
    const char msg[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
    ::send(c, msg, sizeof msg - 1, MSG_NOSIGNAL);
    std::this_thread::sleep_for(100ms);
    ::close(c);
  });
  try {
    TcpStore s("127.0.0.1", ntohs(sa.sin_port), false, 5s);
    FAIL() << "accepted a server that is not a store";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Network);
  }
  impostor.join();
  ::close(lfd);
}

TEST(TcpStore, OwnedServerOnEphemeralPortServesOtherClients) {
  TcpStore owner("127.0.0.1", 0, true, 5s);
  ASSERT_NE(owner.port(), 0);
  TcpStore other("127.0.0.1", owner.port(), false, 5s);
  owner.set("addr/0", "x");
  EXPECT_EQ(other.get("addr/0", 1s), "x");
}

TEST(TcpStore, ManyClientsRendezvous) {
  TcpStoreServer server("127.0.0.1", 0);
  constexpr int kClients = 24;
  std::vector<std::string> keys;
  for (int i = 0; i < kClients; ++i) keys.push_back("rank/" + std::to_string(i));
  std::vector<std::unique_ptr<Thread>> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.push_back(std::make_unique<Thread>([&, i] {
      TcpStore s("127.0.0.1", server.port(), false, 10s);
      s.set(keys[i], std::to_string(i));
      s.wait(keys, 30s);
      for (int j = 0; j < kClients; ++j) EXPECT_EQ(s.get(keys[j], 1s), std::to_string(j));
    }));
  }
  for (auto& t : threads) t->join();
}

TEST(TcpStore, ClientThatDisconnectsWhileBlockedLeavesServerHealthy) {
  TcpStoreServer server("127.0.0.1", 0);
  {
    TcpStore quitter("127.0.0.1", server.port(), false, 5s);
    EXPECT_THROW(quitter.get("nope", 50ms), TimeoutError);
    Thread t([&] { EXPECT_THROW(quitter.wait({"a", "b"}, 100ms), TimeoutError); });
    t.join();
  }
  TcpStore s("127.0.0.1", server.port(), false, 5s);
  s.set("a", "1");
  s.set("b", "2");
  EXPECT_TRUE(s.check({"a", "b"}));
}

// ---------------------------------------------------------------------------
// FileStore.

TEST(FileStore, RefusesAFileThatIsNotAStore) {
  TempPath tmp("foreign");
  const std::string& path = tmp.path;
  { std::ofstream(path) << "this is somebody else's file\n"; }
  try {
    FileStore s(path);
    FAIL() << "opened a foreign file as a store";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(FileStore, ReCreatedFileIsReadAfresh) {
  TempPath tmp("recreate");
  const std::string& path = tmp.path;
  FileStore a(path);
  a.set("old", "1");
  EXPECT_TRUE(a.check({"old"}));
  ::unlink(path.c_str());
  FileStore b(path);
  b.set("new", "2");
  EXPECT_FALSE(a.check({"old"})) << "a must not serve keys from the deleted file";
  EXPECT_EQ(a.get("new", 1s), "2");
}

TEST(FileStore, TornTailIsIgnoredByReadersAndCutByTheNextWriter) {
  TempPath tmp("torn");
  const std::string& path = tmp.path;
  FileStore s(path);
  s.set("k", "v");
  {
    // A writer that died after writing half a record: 'S', key 3, value 3, "ab".
    std::ofstream f(path, std::ios::binary | std::ios::app);
    f << 'S' << le32(3) << le32(3) << "ab";
  }
  FileStore reader(path);
  EXPECT_EQ(reader.get("k", 1s), "v");
  EXPECT_FALSE(reader.check({"abc"}));
  s.set("k2", "v2");
  EXPECT_EQ(reader.get("k2", 1s), "v2");
  EXPECT_EQ(FileStore(path).get("k2", 1s), "v2");
}

TEST(FileStore, CorruptRecordIsAnError) {
  TempPath tmp("corrupt");
  const std::string& path = tmp.path;
  FileStore s(path);
  {
    std::ofstream f(path, std::ios::binary | std::ios::app);
    f << "Xgarbage-garbage";
  }
  try {
    s.check({"k"});
    FAIL() << "read a corrupt file silently";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("corrupt"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace braid
