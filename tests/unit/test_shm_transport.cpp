// Tests of the shared-memory transport. Ranks run as threads (each with its own
// Poller and transport, over an in-memory PeerDirectory) and as forked processes
// (separate address spaces, a file-backed directory, real deaths by SIGKILL). Every
// wait has a deadline. Each test uses a fresh random communicator id, so that tests
// running in parallel never share names, and checks /dev/shm for leftovers.
#include "test_support.hpp"
#include "base/poller.hpp"
#include "transport/shm/shm_transport.hpp"
#include "transport/shm/shm_wire.hpp"

#include <braid/error.hpp>

#include <gtest/gtest.h>

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace bt = braid::transport;
namespace wire = braid::transport::shm_wire;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using State = bt::Request::State;

namespace {

constexpr auto kDeadline = 30s;
const char* const kToken = "shm-secret-token";
constexpr std::size_t kSlot = 64 << 10;  // small slots so that messages span many of them
constexpr int kSlots = 4;

std::uint64_t fresh_comm_id() {
  std::random_device rd;
  return (std::uint64_t{rd()} << 32) ^ rd() ^ static_cast<std::uint64_t>(::getpid());
}

std::string comm_prefix(std::uint64_t comm) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "braid-%016llx-", static_cast<unsigned long long>(comm));
  return buf;
}

/// Names in `dir` that belong to communicator `comm`.
std::vector<std::string> leftovers(std::uint64_t comm, const std::string& dir = "/dev/shm") {
  std::vector<std::string> out;
  const std::string prefix = comm_prefix(comm);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) out.push_back(e->d_name);
  }
  ::closedir(d);
  return out;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// ---------------------------------------------------------------------------
// Directories: in memory (threads) and in files (processes).

class MemDirectory {
 public:
  void publish(int rank, const std::string& key, const std::string& value) {
    {
      std::lock_guard<std::mutex> g(mu_);
      map_[{rank, key}] = value;
    }
    cv_.notify_all();
  }
  std::string lookup(int rank, const std::string& key, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> g(mu_);
    const auto k = std::make_pair(rank, key);
    if (!cv_.wait_for(g, timeout, [&] { return map_.count(k) > 0; })) {
      throw braid::TimeoutError("no '" + key + "' published by rank " + std::to_string(rank));
    }
    return map_[k];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<int, std::string>, std::string> map_;
};

class RankDirectory final : public bt::PeerDirectory {
 public:
  RankDirectory(MemDirectory& d, int rank) : d_(d), rank_(rank) {}
  void publish(const std::string& key, const std::string& value) override { d_.publish(rank_, key, value); }
  std::string lookup(int peer, const std::string& key, std::chrono::milliseconds timeout) override {
    return d_.lookup(peer, key, timeout);
  }
  std::optional<std::string> try_lookup(int peer, const std::string& key) override {
    try {
      return d_.lookup(peer, key, std::chrono::milliseconds(0));
    } catch (const braid::TimeoutError&) {
      return std::nullopt;
    }
  }

 private:
  MemDirectory& d_;
  int rank_;
};

/// One file per (rank, key) in a directory shared by forked processes.
class FileDirectory final : public bt::PeerDirectory {
 public:
  FileDirectory(std::string dir, int rank) : dir_(std::move(dir)), rank_(rank) {}
  void publish(const std::string& key, const std::string& value) override {
    const std::string path = file(rank_, key), tmp = path + ".tmp" + std::to_string(::getpid());
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f << value;
    }
    ::rename(tmp.c_str(), path.c_str());
  }
  std::string lookup(int peer, const std::string& key, std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      if (auto v = try_lookup(peer, key)) return *v;
      if (Clock::now() >= deadline) throw braid::TimeoutError("no '" + key + "' from rank " + std::to_string(peer));
      std::this_thread::sleep_for(1ms);
    }
  }
  std::optional<std::string> try_lookup(int peer, const std::string& key) override {
    std::ifstream f(file(peer, key), std::ios::binary);
    if (!f) return std::nullopt;
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

 private:
  std::string file(int rank, const std::string& key) const { return dir_ + "/" + std::to_string(rank) + "." + key; }
  std::string dir_;
  int rank_;
};

struct TempDir {
  TempDir() : path(braid::test::temp_path("shmdir")) { ::mkdir(path.c_str(), 0700); }
  ~TempDir() {
    if (DIR* d = ::opendir(path.c_str())) {
      while (dirent* e = ::readdir(d)) {
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
          ::unlink((path + "/" + e->d_name).c_str());
        }
      }
      ::closedir(d);
    }
    ::rmdir(path.c_str());
  }
  std::string path;
};

bt::ShmOptions options(std::uint64_t comm, int rank, int size) {
  bt::ShmOptions o;
  o.rank = rank;
  o.size = size;
  o.auth_token = kToken;
  o.comm_id = comm;
  o.slot_bytes = kSlot;
  o.slots = kSlots;
  o.connect_timeout = 10s;
  return o;
}

struct Rank {
  Rank(bt::PeerDirectory& d, const bt::ShmOptions& o)
      : rank(o.rank), transport(bt::make_shm_transport(o, poller, d)) {}

  bt::Connection* to(int peer) { return transport->connection(peer); }
  /// What the engine does: progress, and when nothing moved, arm and block briefly.
  void step(int wait_ms = 1) {
    if (transport->progress()) return;
    if (transport->prepare_sleep()) poller.wait(wait_ms);
  }
  /// Progresses until no request in `reqs` is pending; false when the deadline passes.
  bool drive(const std::vector<bt::Request*>& reqs, Clock::duration limit = kDeadline, int wait_ms = 1) {
    const auto deadline = Clock::now() + limit;
    for (;;) {
      bool pending = false;
      for (const bt::Request* r : reqs) pending = pending || r->state == State::pending;
      if (!pending) return true;
      if (Clock::now() > deadline) return false;
      step(wait_ms);
    }
  }
  void step_for(Clock::duration d) {
    const auto until = Clock::now() + d;
    while (Clock::now() < until) step();
  }

  int rank;
  bt::Poller poller;
  std::unique_ptr<bt::Transport> transport;
};

/// Runs fn on `size` ranks (threads). A rank that returns keeps progressing until
/// every rank has returned, so that peers can finish. Rethrows the first exception.
void run_ranks(int size, const std::function<bt::ShmOptions(int)>& opts, const std::function<void(Rank&)>& fn) {
  MemDirectory dir;
  std::atomic<int> finished{0};
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        RankDirectory d(dir, r);
        Rank rank(d, opts(r));
        try {
          fn(rank);
        } catch (...) {
          errors[static_cast<std::size_t>(r)] = std::current_exception();
        }
        // A rank that bailed out early may have left requests on buffers that are
        // gone: fail them before progressing further.
        if (errors[static_cast<std::size_t>(r)] || ::testing::Test::HasFailure()) {
          rank.transport->close_all("test failed");
        }
        ++finished;
        const auto deadline = Clock::now() + kDeadline;
        while (finished.load() < size && Clock::now() < deadline) rank.step();
      } catch (...) {
        if (!errors[static_cast<std::size_t>(r)]) errors[static_cast<std::size_t>(r)] = std::current_exception();
        ++finished;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

/// Runs fn on `size` forked processes sharing a file directory; each keeps
/// progressing after fn until every rank has finished. Fails the test for any child
/// that did not exit 0.
void run_procs(int size, const std::function<bt::ShmOptions(int)>& opts, const std::function<void(Rank&)>& fn) {
  TempDir tmp;
  braid::test::run_processes_ok(
      size,
      [&](int r) {
        FileDirectory d(tmp.path, r);
        Rank rank(d, opts(r));
        fn(rank);
        if (::testing::Test::HasFailure()) rank.transport->close_all("test failed");
        d.publish("done", "1");
        const auto deadline = Clock::now() + kDeadline;
        for (int p = 0; p < size; ++p) {
          while (!d.try_lookup(p, "done") && Clock::now() < deadline) rank.step();
        }
      },
      std::chrono::seconds(120));
}

std::vector<std::uint8_t> pattern(std::size_t n, std::uint64_t seed) {
  std::vector<std::uint8_t> v(n);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t i = 0; i < n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(v.data() + i, &x, std::min<std::size_t>(8, n - i));
  }
  return v;
}

#define EXPECT_DONE(req) EXPECT_EQ((req).state, State::done) << "error: " << (req).error
#define ASSERT_DONE(req) ASSERT_EQ((req).state, State::done) << "error: " << (req).error

double thread_cpu_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

/// Sends/receives a small message each way so that the connection is up.
void handshake(Rank& r, int peer) {
  std::uint32_t v = 1, w = 0;
  bt::Request s, g;
  r.to(peer)->send(&v, sizeof v, 1, &s);
  r.to(peer)->recv(&w, sizeof w, 1, &g);
  ASSERT_TRUE(r.drive({&s, &g}));
  ASSERT_DONE(s);
  ASSERT_DONE(g);
}

// ---------------------------------------------------------------------------
// Data transfer.

const std::vector<std::size_t>& sizes() {
  static const std::vector<std::size_t> v = {0,         1,         4097,    kSlot - 1,
                                             kSlot,     kSlot + 1, 3 * kSlot + 5, kSlots * kSlot + 1,
                                             std::size_t{8} << 20};
  return v;
}

/// Rank 0 sends every size, rank 1 checks it and echoes it back, rank 0 checks the echo.
void ping_pong(Rank& r) {
  bt::Connection* c = r.to(1 - r.rank);
  for (std::size_t i = 0; i < sizes().size(); ++i) {
    const std::size_t n = sizes()[i];
    const std::uint64_t tag = 100 + i;
    const auto expected = pattern(n, i);
    if (r.rank == 0) {
      std::vector<std::uint8_t> back(n, 0xEE);
      bt::Request s, q;
      c->send(expected.data(), n, tag, &s);
      c->recv(back.data(), n, tag + 1000, &q);
      ASSERT_TRUE(r.drive({&s, &q})) << "size " << n;
      ASSERT_DONE(s);
      ASSERT_DONE(q);
      EXPECT_TRUE(back == expected) << "echo of " << n << " bytes differs";
    } else {
      std::vector<std::uint8_t> in(n, 0xEE);
      bt::Request q, s;
      c->recv(in.data(), n, tag, &q);
      ASSERT_TRUE(r.drive({&q})) << "size " << n;
      ASSERT_DONE(q);
      EXPECT_TRUE(in == expected) << n << " bytes arrived corrupted";
      c->send(in.data(), n, tag + 1000, &s);
      ASSERT_TRUE(r.drive({&s}));
      ASSERT_DONE(s);
    }
  }
}

TEST(ShmTransport, ThreadsPingPongOfEverySizeArrivesIntact) {
  const std::uint64_t comm = fresh_comm_id();
  run_ranks(2, [&](int r) { return options(comm, r, 2); }, ping_pong);
  EXPECT_TRUE(leftovers(comm).empty()) << joined(leftovers(comm));
}

TEST(ShmTransport, ProcessesPingPongOfEverySizeArrivesIntact) {
  const std::uint64_t comm = fresh_comm_id();
  run_procs(2, [&](int r) { return options(comm, r, 2); }, ping_pong);
  EXPECT_TRUE(leftovers(comm).empty()) << joined(leftovers(comm));
}

std::size_t fifo_size(int i) {
  if (i % 40 == 1) return std::size_t{8} << 20;
  if (i % 10 == 5) return (std::size_t{1} << 20) + static_cast<std::size_t>(i);
  if (i % 7 == 0) return 0;
  if (i % 3 == 0) return kSlot + static_cast<std::size_t>(i);
  return 1 + static_cast<std::size_t>(i) * 13;
}

/// Fails the test when a later request completed before an earlier one.
void expect_in_order(const std::vector<bt::Request>& reqs, const char* what) {
  bool gap = false;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    if (reqs[i].state == State::pending) {
      gap = true;
    } else if (gap) {
      ADD_FAILURE() << what << " #" << i << " completed before an earlier one";
      return;
    }
  }
}

/// Both sides post every send (8 MiB ones included) before any receive, then drive
/// with long sleeps: completing at all proves there is no deadlock, and no sleep
/// running to its timeout proves no wake-up was lost.
void fifo_both_ways(Rank& r) {
  constexpr int kCount = 160;
  constexpr int kLongWaitMs = 3000;
  const int peer = 1 - r.rank;
  bt::Connection* c = r.to(peer);
  std::vector<std::vector<std::uint8_t>> out(kCount), in(kCount);
  std::vector<bt::Request> sends(kCount), recvs(kCount);
  for (int i = 0; i < kCount; ++i) {
    out[i] = pattern(fifo_size(i), static_cast<std::uint64_t>(r.rank * 1000 + i));
    c->send(out[i].data(), out[i].size(), static_cast<std::uint64_t>(i), &sends[i]);
  }
  for (int i = 0; i < kCount; ++i) {
    in[i].assign(fifo_size(i), 0xEE);
    c->recv(in[i].data(), in[i].size(), static_cast<std::uint64_t>(i), &recvs[i]);
  }
  std::vector<bt::Request*> all;
  for (auto& q : sends) all.push_back(&q);
  for (auto& q : recvs) all.push_back(&q);
  const auto deadline = Clock::now() + kDeadline;
  bool pending = true;
  int lost = 0;
  while (pending && Clock::now() < deadline) {
    if (!r.transport->progress() && r.transport->prepare_sleep()) {
      const auto t0 = Clock::now();
      if (r.poller.wait(kLongWaitMs) == 0 && Clock::now() - t0 >= std::chrono::milliseconds(kLongWaitMs)) ++lost;
    }
    expect_in_order(sends, "send");
    expect_in_order(recvs, "recv");
    pending = false;
    for (auto* q : all) pending = pending || q->state == State::pending;
  }
  ASSERT_FALSE(pending) << "deadline passed";
  EXPECT_EQ(lost, 0) << "rank " << r.rank << " slept through " << lost << " wake-ups";
  for (int i = 0; i < kCount; ++i) {
    ASSERT_DONE(sends[i]);
    ASSERT_DONE(recvs[i]);
    EXPECT_TRUE(in[i] == pattern(fifo_size(i), static_cast<std::uint64_t>(peer * 1000 + i)))
        << "message " << i << " (" << fifo_size(i) << " bytes) differs";
  }
}

TEST(ShmTransport, ThreadsManyMessagesBothWaysKeepFifoOrderWithoutLostWakeUps) {
  const std::uint64_t comm = fresh_comm_id();
  run_ranks(2, [&](int r) { return options(comm, r, 2); }, fifo_both_ways);
}

TEST(ShmTransport, ProcessesManyMessagesBothWaysKeepFifoOrderWithoutLostWakeUps) {
  const std::uint64_t comm = fresh_comm_id();
  run_procs(2, [&](int r) { return options(comm, r, 2); }, fifo_both_ways);
  EXPECT_TRUE(leftovers(comm).empty()) << joined(leftovers(comm));
}

TEST(ShmTransport, EveryPairOfFourProcessesExchangesMessages) {
  const std::uint64_t comm = fresh_comm_id();
  constexpr int kSize = 4;
  auto bytes = [](int from, int to) { return std::size_t{150000} + static_cast<std::size_t>(from * 1000 + to); };
  run_procs(kSize, [&](int r) { return options(comm, r, kSize); }, [&](Rank& r) {
    std::vector<std::vector<std::uint8_t>> out(kSize), in(kSize);
    std::vector<bt::Request> sends(kSize), recvs(kSize);
    std::vector<bt::Request*> all;
    for (int p = 0; p < kSize; ++p) {
      if (p == r.rank) continue;
      const auto i = static_cast<std::size_t>(p);
      out[i] = pattern(bytes(r.rank, p), static_cast<std::uint64_t>(r.rank * 100 + p));
      in[i].assign(bytes(p, r.rank), 0);
      r.to(p)->recv(in[i].data(), in[i].size(), 9, &recvs[i]);
      r.to(p)->send(out[i].data(), out[i].size(), 9, &sends[i]);
      all.push_back(&sends[i]);
      all.push_back(&recvs[i]);
    }
    ASSERT_TRUE(r.drive(all));
    for (int p = 0; p < kSize; ++p) {
      if (p == r.rank) continue;
      const auto i = static_cast<std::size_t>(p);
      EXPECT_DONE(sends[i]);
      EXPECT_DONE(recvs[i]);
      EXPECT_TRUE(in[i] == pattern(bytes(p, r.rank), static_cast<std::uint64_t>(p * 100 + r.rank)))
          << "from rank " << p;
    }
  });
  EXPECT_TRUE(leftovers(comm).empty()) << joined(leftovers(comm));
}

TEST(ShmTransport, SegmentNameIsGoneOnceTheConnectionIsUp) {
  const std::uint64_t comm = fresh_comm_id();
  std::atomic<int> up{0};
  std::vector<std::string> seen;
  run_ranks(2, [&](int r) { return options(comm, r, 2); }, [&](Rank& r) {
    handshake(r, 1 - r.rank);
    ++up;
    const auto deadline = Clock::now() + kDeadline;
    while (up.load() < 2 && Clock::now() < deadline) r.step();
    if (r.rank == 0) seen = leftovers(comm);
  });
  EXPECT_TRUE(seen.empty()) << "while both ranks are connected: " << joined(seen);
}

// ---------------------------------------------------------------------------
// Mismatches.

TEST(ShmTransport, TagMismatchFailsTheReceiveNamingBothTags) {
  const std::uint64_t comm = fresh_comm_id();
  run_ranks(2, [&](int r) { return options(comm, r, 2); }, [&](Rank& r) {
    std::vector<std::uint8_t> buf(64, 1);
    bt::Connection* c = r.to(1 - r.rank);
    if (r.rank == 0) {
      bt::Request s;
      c->send(buf.data(), buf.size(), 7, &s);
      ASSERT_TRUE(r.drive({&s}));
      return;
    }
    bt::Request q;
    c->recv(buf.data(), buf.size(), 8, &q);
    ASSERT_TRUE(r.drive({&q}));
    ASSERT_EQ(q.state, State::failed);
    EXPECT_TRUE(contains(q.error, "expected tag 8 and 64 bytes, got tag 7 and 64 bytes")) << q.error;
    EXPECT_TRUE(contains(q.error, "rank 0")) << q.error;
    EXPECT_EQ(q.failed_peer, 0);
    EXPECT_FALSE(q.peer_closed);
    bt::Request later;  // the connection is failed for good
    c->recv(buf.data(), buf.size(), 7, &later);
    EXPECT_EQ(later.state, State::failed);
    std::string why;
    EXPECT_TRUE(c->broken(&why));
    EXPECT_TRUE(contains(why, "expected tag 8")) << why;
  });
}

class ShmSizeMismatch : public ::testing::TestWithParam<std::tuple<std::size_t, std::size_t>> {};

TEST_P(ShmSizeMismatch, FailsTheReceiveNamingBothSizes) {
  const std::size_t sent_bytes = std::get<0>(GetParam()), recv_bytes = std::get<1>(GetParam());
  const std::uint64_t comm = fresh_comm_id();
  run_ranks(2, [&](int r) { return options(comm, r, 2); }, [&](Rank& r) {
    std::vector<std::uint8_t> buf(std::max(sent_bytes, recv_bytes), 3);
    bt::Connection* c = r.to(1 - r.rank);
    std::uint8_t one = 1;
    bt::Request first;
    if (r.rank == 0) {
      bt::Request s;
      c->send(&one, 1, 4, &first);
      c->send(buf.data(), sent_bytes, 5, &s);
      r.drive({&first, &s}, 5s);  // may stay pending or fail once the receiver gives up
      return;
    }
    bt::Request q;
    c->recv(&one, 1, 4, &first);
    c->recv(buf.data(), recv_bytes, 5, &q);
    ASSERT_TRUE(r.drive({&first, &q}));
    EXPECT_DONE(first);
    ASSERT_EQ(q.state, State::failed);
    const std::string want = "expected tag 5 and " + std::to_string(recv_bytes) + " bytes, got tag 5 and " +
                             std::to_string(sent_bytes) + " bytes";
    EXPECT_TRUE(contains(q.error, want)) << q.error;
    EXPECT_EQ(q.failed_peer, 0);
    EXPECT_FALSE(q.peer_closed);
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, ShmSizeMismatch,
                         ::testing::Values(std::make_tuple(std::size_t{100}, std::size_t{200}),
                                           std::make_tuple(std::size_t{200}, std::size_t{100}),
                                           std::make_tuple(kSlot * 3, kSlot * 2),
                                           std::make_tuple(kSlot * 2, kSlot * 3),
                                           std::make_tuple(kSlot, kSlot + 1),
                                           std::make_tuple(std::size_t{0}, std::size_t{1})));

TEST(ShmTransport, MismatchedSlotSettingsAreReportedOnBothSides) {
  const std::uint64_t comm = fresh_comm_id();
  std::vector<std::string> errors(2);
  run_ranks(2,
            [&](int r) {
              auto o = options(comm, r, 2);
              if (r == 1) o.slots = kSlots * 2;
              return o;
            },
            [&](Rank& r) {
              std::uint64_t v = 0;
              bt::Request q;
              r.to(1 - r.rank)->recv(&v, sizeof v, 1, &q);
              ASSERT_TRUE(r.drive({&q}, 10s));
              ASSERT_EQ(q.state, State::failed);
              errors[static_cast<std::size_t>(r.rank)] = q.error;
            });
  for (const std::string& e : errors) {
    EXPECT_TRUE(contains(e, "rank 0 uses 4 slots of 65536 bytes, rank 1 uses 8 slots of 65536 bytes")) << e;
  }
  EXPECT_TRUE(leftovers(comm).empty()) << joined(leftovers(comm));
}

// ---------------------------------------------------------------------------
// Peers that go away.

/// A forked child plays rank `killed`; once the connection is up the parent posts a
/// receive (and a send larger than the ring), kills the child with SIGKILL, and
/// must see both fail within a second, naming the child's rank.
class ShmPeerKilled : public ::testing::TestWithParam<int> {};

TEST_P(ShmPeerKilled, PendingRequestsFailWithinASecondNamingThePeer) {
  const int killed = GetParam(), survivor = 1 - killed;
  const std::uint64_t comm = fresh_comm_id();
  TempDir tmp;
  std::fflush(nullptr);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int code = 0;
    {
      FileDirectory d(tmp.path, killed);
      Rank r(d, options(comm, killed, 2));
      handshake(r, survivor);
      if (::testing::Test::HasFailure()) code = 1;
      const auto deadline = Clock::now() + kDeadline;
      while (Clock::now() < deadline) r.step(100);  // wait to be killed
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  FileDirectory d(tmp.path, survivor);
  Rank r(d, options(comm, survivor, 2));
  handshake(r, killed);
  std::vector<std::uint8_t> in(kSlot), out(kSlot * (kSlots + 2), 7);
  bt::Request q, s;
  r.to(killed)->recv(in.data(), in.size(), 2, &q);
  r.to(killed)->send(out.data(), out.size(), 3, &s);  // larger than the ring: stays pending
  r.step_for(50ms);
  ASSERT_EQ(q.state, State::pending);
  ASSERT_EQ(s.state, State::pending);
  const auto t0 = Clock::now();
  ::kill(child, SIGKILL);
  const bool failed = r.drive({&q, &s}, 5s, 100);  // long sleeps: the socket's EOF must wake us
  const double took = ms_since(t0);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(failed) << "the requests still pend 5 s after the peer died";
  EXPECT_LT(took, 1000.0);
  for (const bt::Request* x : {&q, &s}) {
    ASSERT_EQ(x->state, State::failed);
    EXPECT_TRUE(x->peer_closed) << x->error;
    EXPECT_EQ(x->failed_peer, killed);
    EXPECT_TRUE(contains(x->error, "shm connection to rank " + std::to_string(killed))) << x->error;
    EXPECT_TRUE(contains(x->error, "closed by peer")) << x->error;
  }
  r.transport->close_all("test over");
  EXPECT_TRUE(leftovers(comm).empty()) << joined(leftovers(comm));
  std::printf("[ info ] rank %d noticed the death of rank %d after %.1f ms\n", survivor, killed, took);
}

INSTANTIATE_TEST_SUITE_P(CreatorOrAcceptor, ShmPeerKilled, ::testing::Values(0, 1));

TEST(ShmTransport, MessagesSentBeforeThePeerClosedCanStillBeReceived) {
  // The ring lives in our mapping: what a peer published before it went is not
  // lost. Past that, receives fail as closed.
  const std::uint64_t comm = fresh_comm_id();
  MemDirectory dir;
  const auto a = pattern(1000, 1), b = pattern(3 * kSlot, 2);
  std::atomic<bool> gone{false};
  std::thread t0([&] {
    RankDirectory d(dir, 0);
    auto r = std::make_unique<Rank>(d, options(comm, 0, 2));
    bt::Request s1, s2;
    r->to(1)->send(a.data(), a.size(), 1, &s1);
    r->to(1)->send(b.data(), kSlot, 2, &s2);  // fits the ring: done without a receive
    EXPECT_TRUE(r->drive({&s1, &s2}));
    EXPECT_DONE(s1);
    EXPECT_DONE(s2);
    r.reset();
    gone = true;
  });
  RankDirectory d(dir, 1);
  Rank r(d, options(comm, 1, 2));
  r.to(0);
  const auto deadline = Clock::now() + kDeadline;
  while (!gone && Clock::now() < deadline) r.step();
  t0.join();
  r.step_for(50ms);
  EXPECT_FALSE(r.to(0)->broken(nullptr)) << "unread messages are still there to receive";
  std::vector<std::uint8_t> x(a.size()), y(kSlot), z(10);
  bt::Request q1, q2, q3;
  r.to(0)->recv(x.data(), x.size(), 1, &q1);
  r.to(0)->recv(y.data(), y.size(), 2, &q2);
  r.to(0)->recv(z.data(), z.size(), 3, &q3);
  ASSERT_TRUE(r.drive({&q1, &q2, &q3}, 5s));
  EXPECT_DONE(q1);
  EXPECT_DONE(q2);
  EXPECT_TRUE(x == a);
  EXPECT_TRUE(std::equal(y.begin(), y.end(), b.begin()));
  ASSERT_EQ(q3.state, State::failed);
  EXPECT_TRUE(q3.peer_closed);
  EXPECT_EQ(q3.failed_peer, 0);
  EXPECT_TRUE(contains(q3.error, "shm connection to rank 0")) << q3.error;
  EXPECT_TRUE(contains(q3.error, "closed by peer")) << q3.error;
  std::string why;
  EXPECT_TRUE(r.to(0)->broken(&why));
  bt::Request later;
  r.to(0)->send(&later, 0, 4, &later);
  EXPECT_EQ(later.state, State::failed);
  EXPECT_TRUE(leftovers(comm).empty()) << joined(leftovers(comm));
}

TEST(ShmTransport, CloseWhileIdleMakesTheConnectionBroken) {
  const std::uint64_t comm = fresh_comm_id();
  MemDirectory dir;
  std::atomic<bool> gone{false};
  std::thread t1([&] {
    RankDirectory d(dir, 1);
    auto r = std::make_unique<Rank>(d, options(comm, 1, 2));
    handshake(*r, 0);
    r->step_for(20ms);
    r.reset();
    gone = true;
  });
  RankDirectory d(dir, 0);
  Rank r(d, options(comm, 0, 2));
  handshake(r, 1);
  const auto deadline = Clock::now() + kDeadline;
  while (!gone && Clock::now() < deadline) r.step();
  t1.join();
  r.step_for(50ms);
  std::string why;
  EXPECT_TRUE(r.to(1)->broken(&why));
  EXPECT_TRUE(contains(why, "shm connection to rank 1") && contains(why, "closed by peer")) << why;
}

TEST(ShmTransport, CloseAllFailsPendingRequestsCleansUpAndIsIdempotent) {
  const std::uint64_t comm = fresh_comm_id();
  MemDirectory dir;
  RankDirectory d0(dir, 0), d1(dir, 1);
  Rank r0(d0, options(comm, 0, 2)), r1(d1, options(comm, 1, 2));
  std::uint64_t v = 0, w = 0;
  bt::Request q0, q1;
  r0.to(1)->recv(&v, sizeof v, 1, &q0);
  r1.to(0)->recv(&w, sizeof w, 1, &q1);
  for (int i = 0; i < 50; ++i) {
    r0.step();
    r1.step();
  }
  ASSERT_EQ(q0.state, State::pending);
  // A name a killed rank of this communicator could have left behind, and one of a
  // pair rank 0 is not part of.
  const std::string mine = "/dev/shm/" + bt::shm_segment_name(comm, 0, 1);
  const std::string other = "/dev/shm/" + bt::shm_segment_name(comm, 2, 3);
  std::ofstream(mine) << "x";
  std::ofstream(other) << "x";
  r0.transport->close_all("aborted by test");
  ASSERT_EQ(q0.state, State::failed);
  EXPECT_EQ(q0.error, "aborted by test");
  EXPECT_EQ(q0.failed_peer, -1);
  EXPECT_NE(::access(mine.c_str(), F_OK), 0) << "close_all left " << mine;
  EXPECT_EQ(::access(other.c_str(), F_OK), 0) << "close_all removed a name of another pair";
  ::unlink(other.c_str());
  r0.transport->close_all("again");
  bt::Request later;
  r0.to(1)->send(&v, sizeof v, 1, &later);
  EXPECT_EQ(later.state, State::failed);
  EXPECT_EQ(later.error, "aborted by test");
  EXPECT_FALSE(r0.transport->progress());
  // The peer sees the close as a closed connection.
  ASSERT_TRUE(r1.drive({&q1}, 5s));
  ASSERT_EQ(q1.state, State::failed);
  EXPECT_TRUE(q1.peer_closed) << q1.error;
  EXPECT_TRUE(leftovers(comm).empty()) << joined(leftovers(comm));
}

// ---------------------------------------------------------------------------
// /dev/shm too small.

TEST(ShmTransport, SegmentLargerThanDevShmGivesAClearErrorOnBothSides) {
  // 2 rings x 64 slots x 1 GiB = 128 GiB: more than /dev/shm has free. The check
  // and posix_fallocate refuse it up front; nothing is allocated.
  struct statvfs st {};
  ASSERT_EQ(::statvfs("/dev/shm", &st), 0) << "no /dev/shm";
  const std::uint64_t free_bytes = std::uint64_t{st.f_bavail} * st.f_frsize;
  const std::size_t slot = std::size_t{1} << 30;
  const int slots = 64;
  if (free_bytes >= bt::shm_segment_bytes(slot, slots)) GTEST_SKIP() << "/dev/shm has more than 128 GiB free";
  const std::uint64_t comm = fresh_comm_id();
  std::vector<std::string> errors(2);
  run_ranks(2,
            [&](int r) {
              auto o = options(comm, r, 2);
              o.slot_bytes = slot;
              o.slots = slots;
              return o;
            },
            [&](Rank& r) {
              std::uint64_t v = 0;
              bt::Request q;
              r.to(1 - r.rank)->recv(&v, sizeof v, 1, &q);
              ASSERT_TRUE(r.drive({&q}, 10s));
              ASSERT_EQ(q.state, State::failed);
              EXPECT_EQ(q.failed_peer, 1 - r.rank);
              errors[static_cast<std::size_t>(r.rank)] = q.error;
            });
  for (const std::string& e : errors) {
    EXPECT_TRUE(contains(e, "/dev/shm is too small")) << e;
    EXPECT_TRUE(contains(e, "free of")) << e;
    EXPECT_TRUE(contains(e, "131072.0 MiB needed")) << e;
    EXPECT_TRUE(contains(e, "--shm-size")) << e;
    EXPECT_TRUE(contains(e, "BRAID_TRANSPORT=tcp")) << e;
  }
  EXPECT_TRUE(contains(errors[1], "rank 0 could not set up shared memory with rank 1")) << errors[1];
  EXPECT_TRUE(leftovers(comm).empty()) << joined(leftovers(comm));
}

TEST(ShmTransport, MissingSegmentDirectoryIsNamedInTheError) {
  const std::uint64_t comm = fresh_comm_id();
  std::string error;
  run_ranks(2,
            [&](int r) {
              auto o = options(comm, r, 2);
              o.segment_dir = "/nonexistent-braid-shm-dir";
              return o;
            },
            [&](Rank& r) {
              std::uint64_t v = 0;
              bt::Request q;
              r.to(1 - r.rank)->recv(&v, sizeof v, 1, &q);
              ASSERT_TRUE(r.drive({&q}, 10s));
              ASSERT_EQ(q.state, State::failed);
              if (r.rank == 0) error = q.error;
            });
  EXPECT_TRUE(contains(error, "cannot use /nonexistent-braid-shm-dir: No such file or directory")) << error;
}

// ---------------------------------------------------------------------------
// Sleeping and waking.

TEST(ShmTransport, IdleTransportLetsThePollerSleepAndAMessageWakesItPromptly) {
  const std::uint64_t comm = fresh_comm_id();
  MemDirectory dir;
  std::atomic<bool> ready{false}, go{false}, finished{false};
  std::atomic<std::int64_t> sent_at{0};
  std::thread t1([&] {
    RankDirectory d(dir, 1);
    Rank r(d, options(comm, 1, 2));
    handshake(r, 0);
    ready = true;
    const auto deadline = Clock::now() + kDeadline;
    while (!go && Clock::now() < deadline) r.step(20);
    std::uint64_t v = 99;
    bt::Request s;
    sent_at = Clock::now().time_since_epoch().count();
    r.to(0)->send(&v, sizeof v, 5, &s);
    EXPECT_TRUE(r.drive({&s}));
    // Stay alive: a closing socket would wake the receiver too, doorbell or not.
    const auto until = Clock::now() + kDeadline;
    while (!finished && Clock::now() < until) r.step(20);
  });
  RankDirectory d(dir, 0);
  Rank r(d, options(comm, 0, 2));
  handshake(r, 1);
  const auto deadline = Clock::now() + kDeadline;
  while (!ready && Clock::now() < deadline) r.step();
  std::uint64_t got = 0;
  bt::Request q;
  r.to(1)->recv(&got, sizeof got, 5, &q);
  r.step_for(20ms);
  EXPECT_FALSE(r.transport->progress()) << "progress keeps reporting work while idle";
  // Idle: prepare_sleep agrees, and wait(100) blocks ~100 ms without burning CPU.
  ASSERT_TRUE(r.transport->prepare_sleep());
  const double cpu0 = thread_cpu_ms();
  const auto t0 = Clock::now();
  const int events = r.poller.wait(100);
  const double slept = ms_since(t0), cpu = thread_cpu_ms() - cpu0;
  EXPECT_EQ(events, 0);
  EXPECT_GE(slept, 95.0);
  EXPECT_LT(cpu, 10.0) << "the wait burned CPU";
  EXPECT_EQ(q.state, State::pending);
  // Now sleep for up to 5 s while the peer sends: the doorbell must end the wait.
  EXPECT_FALSE(r.transport->progress());
  ASSERT_TRUE(r.transport->prepare_sleep());
  go = true;
  const int woke = r.poller.wait(5000);
  const auto woke_at = Clock::now();
  EXPECT_GE(woke, 1);
  ASSERT_TRUE(r.drive({&q}, 5s));
  EXPECT_DONE(q);
  EXPECT_EQ(got, 99u);
  const double latency =
      std::chrono::duration<double, std::milli>(woke_at.time_since_epoch() - Clock::duration(sent_at.load())).count();
  EXPECT_LT(latency, 500.0) << "the doorbell did not end the wait";
  std::printf("[ info ] woken %.3f ms after the peer posted its send\n", latency);
  finished = true;
  t1.join();
}

TEST(ShmTransport, ProducerWaitingForSlotsIsWokenWhenTheReceiverFreesThem) {
  // The sender's message is 4x the ring; both sides sleep up to 5 s at a time, so
  // the transfer only finishes quickly if every "slots freed" and "slot published"
  // doorbell arrives.
  const std::uint64_t comm = fresh_comm_id();
  const auto data = pattern(kSlot * kSlots * 4, 9);
  std::atomic<bool> posted{false};
  run_ranks(2, [&](int r) { return options(comm, r, 2); }, [&](Rank& r) {
    handshake(r, 1 - r.rank);
    const auto t0 = Clock::now();
    if (r.rank == 0) {
      bt::Request s;
      r.to(1)->send(data.data(), data.size(), 1, &s);
      ASSERT_TRUE(r.drive({&s}, kDeadline, 5000));
      EXPECT_DONE(s);
    } else {
      std::this_thread::sleep_for(200ms);  // the sender fills the ring and sleeps
      std::vector<std::uint8_t> in(data.size());
      bt::Request q;
      r.to(0)->recv(in.data(), in.size(), 1, &q);
      posted = true;
      ASSERT_TRUE(r.drive({&q}, kDeadline, 5000));
      EXPECT_DONE(q);
      EXPECT_TRUE(in == data);
    }
    EXPECT_LT(ms_since(t0), 3000.0) << "rank " << r.rank << " slept through a doorbell";
  });
}

TEST(ShmTransport, UnmatchedMessageDoesNotKeepWakingTheReceiver) {
  const std::uint64_t comm = fresh_comm_id();
  std::atomic<bool> sent{false}, checked{false};
  const auto data = pattern(6000, 5);
  run_ranks(2, [&](int r) { return options(comm, r, 2); }, [&](Rank& r) {
    bt::Connection* c = r.to(1 - r.rank);
    if (r.rank == 0) {
      bt::Request s;
      c->send(data.data(), data.size(), 1, &s);
      ASSERT_TRUE(r.drive({&s}));
      ASSERT_DONE(s);
      sent = true;
      return;
    }
    const auto deadline = Clock::now() + kDeadline;
    while (!sent && Clock::now() < deadline) r.step();
    r.step_for(50ms);
    int events = 0, busy = 0;
    for (int i = 0; i < 10; ++i) {
      if (r.transport->progress()) ++busy;
      if (r.transport->prepare_sleep()) {
        events += r.poller.wait(20);
      } else {
        ++busy;
      }
    }
    EXPECT_EQ(busy, 0) << "an unreceived message keeps the transport busy";
    EXPECT_LE(events, 1) << "the poller keeps waking up for a message nobody asked for";
    std::vector<std::uint8_t> in(data.size());
    bt::Request q;
    c->recv(in.data(), in.size(), 1, &q);
    ASSERT_TRUE(r.drive({&q}));
    ASSERT_DONE(q);
    EXPECT_TRUE(in == data);
    checked = true;
  });
  EXPECT_TRUE(checked);
}

// ---------------------------------------------------------------------------
// Set-up.

TEST(ShmTransport, LatePeerIsFoundWithoutBlockingProgress) {
  const std::uint64_t comm = fresh_comm_id();
  MemDirectory dir;
  std::uint64_t v = 42, got = 0;
  bt::Request s, q;
  std::thread late([&] {
    std::this_thread::sleep_for(300ms);
    RankDirectory d1(dir, 1);
    Rank r1(d1, options(comm, 1, 2));
    r1.to(0)->recv(&got, sizeof got, 7, &q);
    EXPECT_TRUE(r1.drive({&q}, 10s));
  });
  RankDirectory d0(dir, 0);
  Rank r0(d0, options(comm, 0, 2));
  r0.to(1)->send(&v, sizeof v, 7, &s);
  Clock::duration longest{0};
  const auto start = Clock::now();
  const auto deadline = start + 10s;
  while (s.state == State::pending && Clock::now() < deadline) {
    const auto t0 = Clock::now();
    r0.transport->progress();
    longest = std::max(longest, Clock::now() - t0);
    // Long waits: only the transport's own timer wakes the poller for lookups.
    if (r0.transport->prepare_sleep()) r0.poller.wait(5000);
  }
  late.join();
  EXPECT_EQ(s.state, State::done) << s.error;
  EXPECT_EQ(got, 42u);
  EXPECT_LT(longest, 50ms) << "progress() blocked while the peer's name was missing";
  EXPECT_LT(Clock::now() - start, 3s) << "the retry timer did not wake the poller";
}

TEST(ShmTransport, MissingPeerFailsTheRequestAfterTheTimeout) {
  const std::uint64_t comm = fresh_comm_id();
  MemDirectory dir;
  RankDirectory d(dir, 0);
  auto o = options(comm, 0, 2);
  o.connect_timeout = 100ms;
  Rank r(d, o);
  std::uint64_t v = 0;
  bt::Request q;
  r.to(1)->send(&v, sizeof v, 1, &q);
  ASSERT_TRUE(r.drive({&q}, 5s));
  ASSERT_EQ(q.state, State::failed);
  EXPECT_TRUE(contains(q.error, "cannot connect to rank 1 over shared memory")) << q.error;
  EXPECT_TRUE(contains(q.error, "within 100 ms")) << q.error;
}

TEST(ShmTransport, PeerThatIsNotListeningFailsAtOnce) {
  // Published, but nothing listens (another host or network namespace, or gone).
  const std::uint64_t comm = fresh_comm_id();
  MemDirectory dir;
  dir.publish(1, "shm", "braid-shm-nobody-listens-here");
  RankDirectory d(dir, 0);
  Rank r(d, options(comm, 0, 2));
  std::uint64_t v = 0;
  bt::Request q;
  r.to(1)->send(&v, sizeof v, 1, &q);
  ASSERT_TRUE(r.drive({&q}, 5s));
  ASSERT_EQ(q.state, State::failed);
  EXPECT_TRUE(contains(q.error, "Connection refused")) << q.error;
  EXPECT_TRUE(contains(q.error, "same network namespace")) << q.error;
  EXPECT_EQ(q.failed_peer, 1);
  EXPECT_TRUE(leftovers(comm).empty()) << joined(leftovers(comm));
}

int raw_connect(const std::string& name) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (fd < 0 || ::connect(fd, reinterpret_cast<const sockaddr*>(&a), len) != 0) {
    ADD_FAILURE() << "connect to @" << name << ": " << std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

bool wait_closed(int fd, Clock::duration limit = 5s) {
  const auto deadline = Clock::now() + limit;
  char buf[256];
  while (Clock::now() < deadline) {
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, 50) <= 0) continue;
    const ssize_t r = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return true;
  }
  return false;
}

std::string hello(std::uint64_t comm, int from, int to, const std::string& token = kToken) {
  wire::Hello h;
  h.token_bytes = static_cast<std::uint16_t>(token.size());
  h.from_rank = from;
  h.to_rank = to;
  h.slots = kSlots;
  h.comm_id = comm;
  h.slot_bytes = kSlot;
  return wire::hello_bytes(h, token, "");
}

TEST(ShmTransport, BadHellosAreRefusedAndTheRealPeerStillConnects) {
  const std::uint64_t comm = fresh_comm_id();
  MemDirectory dir;
  const auto data = pattern(1000, 77);
  std::atomic<bool> impostors_done{false}, real_peer_started{false};
  std::atomic<int> refused{0};
  bool finished_early = false;
  bt::Request q;
  std::vector<std::uint8_t> in(data.size());
  std::thread t1([&] {
    RankDirectory d(dir, 1);
    auto o = options(comm, 1, 2);
    o.on_refused = [&](const std::string&) { ++refused; };
    Rank r(d, o);
    r.to(0)->recv(in.data(), in.size(), 3, &q);
    r.drive({&q});
    finished_early = !real_peer_started;
    const auto deadline = Clock::now() + 5s;
    while (!impostors_done && Clock::now() < deadline) r.step();
  });
  const std::string name = dir.lookup(1, "shm", 10s);
  const std::vector<std::pair<const char*, std::string>> impostors = {
      {"wrong token", hello(comm, 0, 1, "not-the-token")},
      {"empty token", hello(comm, 0, 1, "")},
      {"other communicator", hello(comm + 1, 0, 1)},
      {"rank out of range", hello(comm, 5, 1)},
      {"rank that should accept, not connect", hello(comm, 1, 1)},
      {"addressed to another rank", hello(comm, 0, 2)},
      {"not a hello", "GET / HTTP/1.1\r\nHost: x\r\n\r\n"},
  };
  for (const auto& imp : impostors) {
    const int fd = raw_connect(name);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, imp.second.data(), imp.second.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(imp.second.size()));
    EXPECT_TRUE(wait_closed(fd)) << imp.first << ": the listener did not close the socket";
    ::close(fd);
  }
  EXPECT_EQ(refused.load(), static_cast<int>(impostors.size()));
  real_peer_started = true;
  std::thread t0([&] {
    RankDirectory d(dir, 0);
    Rank r(d, options(comm, 0, 2));
    bt::Request s;
    r.to(1)->send(data.data(), data.size(), 3, &s);
    ASSERT_TRUE(r.drive({&s}));
    EXPECT_DONE(s);
    impostors_done = true;
    r.step_for(50ms);
  });
  t0.join();
  t1.join();
  EXPECT_FALSE(finished_early) << "an impostor disturbed the real connection: " << q.error;
  EXPECT_DONE(q);
  EXPECT_TRUE(in == data);
}

TEST(ShmTransport, PeerWithAnotherTokenIsRefusedAndTheConnectorSaysWhy) {
  const std::uint64_t comm = fresh_comm_id();
  std::string error;
  std::atomic<int> refused{0};
  run_ranks(2,
            [&](int r) {
              auto o = options(comm, r, 2);
              if (r == 0) o.auth_token = "another-job";
              o.on_refused = [&](const std::string&) { ++refused; };
              return o;
            },
            [&](Rank& r) {
              std::uint64_t v = 0;
              bt::Request q;
              if (r.rank == 1) {
                r.to(0)->recv(&v, sizeof v, 1, &q);
                r.step_for(300ms);  // nothing may arrive
                EXPECT_EQ(q.state, State::pending) << q.error;
                r.transport->close_all("test over");
                return;
              }
              r.to(1)->send(&v, sizeof v, 1, &q);
              ASSERT_TRUE(r.drive({&q}, 10s));
              ASSERT_EQ(q.state, State::failed);
              error = q.error;
            });
  EXPECT_TRUE(contains(error, "cannot connect to rank 1 over shared memory")) << error;
  EXPECT_TRUE(contains(error, "refused this rank's hello")) << error;
  EXPECT_EQ(refused.load(), 1);
  EXPECT_TRUE(leftovers(comm).empty()) << joined(leftovers(comm));
}

TEST(ShmTransport, AuthenticatedHelloWithoutASegmentIsAProtocolError) {
  const std::uint64_t comm = fresh_comm_id();
  MemDirectory dir;
  bt::Request q;
  std::uint64_t v = 0;
  std::thread t1([&] {
    RankDirectory d(dir, 1);
    Rank r(d, options(comm, 1, 2));
    r.to(0)->recv(&v, sizeof v, 1, &q);
    r.drive({&q}, 10s);
  });
  const int fd = raw_connect(dir.lookup(1, "shm", 10s));
  ASSERT_GE(fd, 0);
  const std::string h = hello(comm, 0, 1);
  ASSERT_EQ(::send(fd, h.data(), h.size(), MSG_NOSIGNAL), static_cast<ssize_t>(h.size()));
  t1.join();
  EXPECT_TRUE(wait_closed(fd));
  ::close(fd);
  ASSERT_EQ(q.state, State::failed);
  EXPECT_TRUE(contains(q.error, "carried no segment")) << q.error;
  EXPECT_EQ(q.failed_peer, 0);
}

TEST(ShmTransport, InvalidOptionsAndPeersAreRejected) {
  const std::uint64_t comm = fresh_comm_id();
  MemDirectory dir;
  bt::Poller poller;
  RankDirectory d(dir, 0);
  auto o = options(comm, 0, 2);
  o.slots = 0;
  EXPECT_THROW(bt::make_shm_transport(o, poller, d), braid::Error);
  o = options(comm, 0, 2);
  o.slot_bytes = 5000;
  EXPECT_THROW(bt::make_shm_transport(o, poller, d), braid::Error);
  o = options(comm, 2, 2);
  EXPECT_THROW(bt::make_shm_transport(o, poller, d), braid::Error);
  Rank r(d, options(comm, 0, 2));
  EXPECT_THROW(r.to(0), braid::Error);
  EXPECT_THROW(r.to(2), braid::Error);
  EXPECT_THROW(r.to(1)->send(nullptr, 8, 1, nullptr), braid::Error);
  EXPECT_STREQ(r.transport->name(), "shm");
}

TEST(ShmTransport, SegmentSizeAndNameAreAsDocumented) {
  // 4 KiB header page; per ring 512 B control + 64 B per slot rounded to a page,
  // then the slots.
  EXPECT_EQ(bt::shm_segment_bytes(512 << 10, 8), 4096u + 2 * (4096u + 8 * (512u << 10)));
  EXPECT_EQ(bt::shm_segment_name(0xabcdefu, 3, 1), "braid-0000000000abcdef-1-3");
}

}  // namespace
