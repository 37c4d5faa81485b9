// Tests of what only the shared-memory transport has (segments and their names, slot
// settings, /dev/shm limits, doorbells and sleeping, its hello and its fd passing); the
// contract every transport keeps is in test_transport_conformance.cpp. Ranks run as
// threads and as forked processes (transport_harness.hpp). Every wait has a deadline. Each test uses a fresh random communicator id, so that tests
// running in parallel never share names, and checks /dev/shm for leftovers.
#include "test_support.hpp"
#include "base/poller.hpp"
#include "transport_harness.hpp"
#include "transport/shm/shm_transport.hpp"
#include "transport/shm/shm_wire.hpp"
#include "transport/skeleton.hpp"
#include "base/auth.hpp"
#include "gpu/runtime.hpp"

#include <braid/error.hpp>

#include <gtest/gtest.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>

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
#include <cstdlib>
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

namespace wire = braid::transport::shm_wire;
using namespace braid::test;
using namespace std::chrono_literals;

namespace {

constexpr auto kDeadline = 30s;
const char* const kToken = "shm-secret-token";
constexpr std::size_t kSlot = 64 << 10;  // small slots so that messages span many of them
constexpr int kSlots = 4;

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
/// A shared-memory rank with these options (transport_harness.hpp).
struct Rank : TransportRank {
  Rank(bt::PeerDirectory& d, const bt::ShmOptions& o)
      : TransportRank(d, o, [o](const bt::CommonOptions&, bt::Poller& p, bt::PeerDirectory& dir) {
          return bt::make_shm_transport(o, p, dir);
        }) {}
};

void run_ranks(int size, const std::function<bt::ShmOptions(int)>& opts,
               const std::function<void(TransportRank&)>& fn) {
  run_thread_ranks(
      size, [&](int r) -> bt::CommonOptions { return opts(r); },
      [&](const bt::CommonOptions& c, bt::Poller& p, bt::PeerDirectory& d) {
        return bt::make_shm_transport(opts(c.rank), p, d);
      },
      fn);
}

/// Two ranks with options `opts` each receive from the other where setting up the
/// connection must fail; returns each rank's failed request (its error, the rank blamed).
std::vector<bt::Request> failed_receives(const std::function<bt::ShmOptions(int)>& opts) {
  std::vector<bt::Request> reqs(2);
  run_ranks(2, opts, [&](TransportRank& r) {
    std::uint64_t v = 0;
    bt::Request& q = reqs[static_cast<std::size_t>(r.rank)];
    r.to(1 - r.rank)->recv(&v, sizeof v, 1, &q);
    ASSERT_TRUE(r.drive({&q}, 10s));
    ASSERT_EQ(q.state, State::failed);
  });
  return reqs;
}

bt::ShmOptions options(std::uint64_t comm, int rank, int size) {
  bt::ShmOptions o;
  static_cast<bt::CommonOptions&>(o) = common_options(rank, size, comm);
  o.auth_token = kToken;
  o.slot_bytes = kSlot;
  o.slots = kSlots;
  return o;
}

TEST(ShmTransport, SegmentNameIsGoneOnceTheConnectionIsUp) {
  const std::uint64_t comm = fresh_comm_id();
  std::atomic<int> up{0};
  std::vector<std::string> seen;
  run_ranks(2, [&](int r) { return options(comm, r, 2); }, [&](TransportRank& r) {
    r.handshake(1 - r.rank);
    ++up;
    const auto deadline = Clock::now() + kDeadline;
    while (up.load() < 2 && Clock::now() < deadline) r.step();
    if (r.rank == 0) seen = leftovers(comm);
  });
  EXPECT_TRUE(seen.empty()) << "while both ranks are connected: " << joined(seen);
}


TEST(ShmTransport, MismatchedSlotSettingsAreReportedOnBothSides) {
  const std::uint64_t comm = fresh_comm_id();
  const auto reqs = failed_receives([&](int r) {
    auto o = options(comm, r, 2);
    if (r == 1) o.slots = kSlots * 2;
    return o;
  });
  for (const bt::Request& q : reqs) {
    EXPECT_TRUE(contains(q.error, "rank 0 uses 4 slots of 65536 bytes, rank 1 uses 8 slots of 65536 bytes")) << q.error;
  }
  EXPECT_TRUE(leftovers(comm).empty()) << joined(leftovers(comm));
}

// ---------------------------------------------------------------------------
// Peers that go away.

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
  const auto reqs = failed_receives([&](int r) {
    auto o = options(comm, r, 2);
    o.slot_bytes = slot;
    o.slots = slots;
    return o;
  });
  std::vector<std::string> errors;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(reqs[static_cast<std::size_t>(r)].failed_peer, 1 - r);
    errors.push_back(reqs[static_cast<std::size_t>(r)].error);
  }
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
  const auto reqs = failed_receives([&](int r) {
    auto o = options(comm, r, 2);
    o.segment_dir = "/nonexistent-braid-shm-dir";
    return o;
  });
  const std::string& error = reqs[0].error;
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
    r.handshake(0);
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
  r.handshake(1);
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
  run_ranks(2, [&](int r) { return options(comm, r, 2); }, [&](TransportRank& r) {
    r.handshake(1 - r.rank);
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

// ---------------------------------------------------------------------------
// Set-up.

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

std::string hello(std::uint64_t comm, int from, int to, const std::string& token = kToken) {
  wire::Hello h;
  h.token_bytes = static_cast<std::uint16_t>(braid::base::auth::kProofBytes);
  h.from_rank = from;
  h.to_rank = to;
  h.slots = kSlots;
  h.comm_id = comm;
  h.slot_bytes = kSlot;
  const std::string fixed = wire::hello_bytes(h, "", "");
  return fixed + braid::transport::hello_proof(token, fixed);  // as the transport makes it
}

// The doorbell's abstract name is visible to every user of the host (/proc/net/unix): a
// process of another user is refused even with an authentic hello (it would have had to
// read the token, but the rule holds regardless), and the real peer still connects.
TEST(ShmTransport, AConnectionFromAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to connect as another user";
  const std::uint64_t comm = fresh_comm_id();
  MemDirectory dir;
  RankDirectory d0(dir, 0), d1(dir, 1);
  std::mutex mu;
  std::string why;
  expect_impostors_refused(
      [&](int r) {
        auto o = options(comm, r, 2);
        if (r == 1)
          o.on_refused = [&](const std::string& w) {
            std::lock_guard<std::mutex> lock(mu);
            why = w;
          };
        return std::make_unique<Rank>(r == 0 ? d0 : d1, o);
      },
      [&] {
        const std::string name = dir.lookup(1, "shm", 10s);
        // This thread only (the raw system call; glibc's seteuid changes every thread).
        EXPECT_EQ(::syscall(SYS_setresuid, -1, 65534, -1), 0);
        const int fd = raw_connect(name);
        EXPECT_EQ(::syscall(SYS_setresuid, -1, 0, -1), 0);
        return fd;
      },
      {{"authentic hello from another user", hello(comm, 0, 1)}});
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(contains(why, "another user")) << why;
}

TEST(ShmTransport, BadHellosAreRefusedAndTheRealPeerStillConnects) {
  const std::uint64_t comm = fresh_comm_id();
  MemDirectory dir;
  RankDirectory d0(dir, 0), d1(dir, 1);
  std::atomic<int> refused{0};
  const Impostors impostors = {
      {"wrong token", hello(comm, 0, 1, "not-the-token")},
      {"empty token", hello(comm, 0, 1, "")},
      {"other communicator", hello(comm + 1, 0, 1)},
      {"rank out of range", hello(comm, 5, 1)},
      {"rank that should accept, not connect", hello(comm, 1, 1)},
      {"addressed to another rank", hello(comm, 0, 2)},
      {"not a hello", "GET / HTTP/1.1\r\nHost: x\r\n\r\n"},
  };
  expect_impostors_refused(
      [&](int r) {
        auto o = options(comm, r, 2);
        if (r == 1) o.on_refused = [&](const std::string&) { ++refused; };
        return std::make_unique<Rank>(r == 0 ? d0 : d1, o);
      },
      [&] { return raw_connect(dir.lookup(1, "shm", 10s)); }, impostors);
  EXPECT_EQ(refused.load(), static_cast<int>(impostors.size()));
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
            [&](TransportRank& r) {
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

// --- GPU buffers (the emulated GPU runtime) ------------------------------------------------

namespace {

/// One emulated GPU runtime for these tests: its device memory is memfd-backed, and
/// ipc_open in another process maps the exporter's memfd, so that a device ring at the wrong
/// address or offset would carry the wrong bytes.
braid::gpu::Runtime& emulated_gpu() {
  static const std::unique_ptr<braid::gpu::Runtime> rt = braid::gpu::make_emulated();
  return *rt;
}

/// Fills a buffer of kind `device` (through the runtime) with pattern `seed`.
struct Buf {
  Buf(std::size_t n, bool on_device) : bytes(n), device(on_device) {
    p = static_cast<unsigned char*>(device ? emulated_gpu().alloc_device(n, 0) : std::malloc(std::max<std::size_t>(n, 1)));
  }
  ~Buf() {
    if (device) {
      emulated_gpu().free_device(p);
    } else {
      std::free(p);
    }
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  void fill(unsigned seed) {
    std::vector<unsigned char> h(bytes);
    for (std::size_t k = 0; k < bytes; ++k) h[k] = static_cast<unsigned char>(k * 31 + seed);
    emulated_gpu().copy(p, h.data(), bytes);
  }
  bool holds(unsigned seed) const {
    std::vector<unsigned char> h(bytes);
    emulated_gpu().copy(h.data(), p, bytes);
    for (std::size_t k = 0; k < bytes; ++k)
      if (h[k] != static_cast<unsigned char>(k * 31 + seed)) return false;
    return true;
  }
  std::size_t bytes;
  bool device;
  unsigned char* p;
};

/// Both ways between two ranks: messages of several sizes in every combination of host and
/// device buffers at the two ends, in one FIFO, checked.
void mixed_exchange(TransportRank& r) {
  bt::Connection* c = r.to(1 - r.rank);
  EXPECT_TRUE(c->takes_device_memory());
  const std::vector<std::size_t> sizes = {0, 1, 4096, kSlot, 3 * kSlot + 17, 10 * kSlot};
  std::vector<std::unique_ptr<Buf>> out, in;
  std::vector<bt::Request> s, q;
  s.resize(sizes.size() * 4);
  q.resize(sizes.size() * 4);
  std::vector<bt::Request*> all;
  std::size_t i = 0;
  for (const bool send_dev : {true, false}) {
    for (const bool recv_dev : {true, false}) {
      for (const std::size_t n : sizes) {
        // This rank sends with send_dev and receives with recv_dev; the peer mirrors, so
        // rank 0's (send_dev, recv_dev) meets rank 1's (recv_dev, send_dev) message.
        const bool my_send_dev = r.rank == 0 ? send_dev : recv_dev;
        const bool my_recv_dev = r.rank == 0 ? recv_dev : send_dev;
        out.push_back(std::make_unique<Buf>(n, my_send_dev));
        out.back()->fill(static_cast<unsigned>(i * 2 + r.rank));
        in.push_back(std::make_unique<Buf>(n, my_recv_dev));
        if (my_recv_dev) {
          c->recv_device(in.back()->p, n, 50 + i, &q[i]);
        } else {
          c->recv(in.back()->p, n, 50 + i, &q[i]);
        }
        if (my_send_dev) {
          c->send_device(out.back()->p, n, 50 + i, &s[i]);
        } else {
          c->send(out.back()->p, n, 50 + i, &s[i]);
        }
        all.push_back(&s[i]);
        all.push_back(&q[i]);
        ++i;
      }
    }
  }
  ASSERT_TRUE(r.drive(all, kDeadline));
  for (bt::Request* x : all) ASSERT_EQ(x->state, State::done) << x->error;
  for (std::size_t k = 0; k < in.size(); ++k)
    EXPECT_TRUE(in[k]->holds(static_cast<unsigned>(k * 2 + 1 - r.rank))) << "message " << k;
}

bt::ShmOptions gpu_options(std::uint64_t comm, int rank, bool ring) {
  bt::ShmOptions o = options(comm, rank, 2);
  o.gpu = &emulated_gpu();
  o.gpu_device = 0;
  o.device_ring = ring;
  return o;
}

}  // namespace

TEST(ShmTransport, GpuBuffersMoveThroughTheDeviceRingWithHostOnesInOneFifo) {
  // Threads of one process (hi uses lo's pointer), with and without the device ring.
  for (const bool ring : {true, false}) {
    SCOPED_TRACE(ring ? "device ring" : "host ring only");
    const std::uint64_t comm = fresh_comm_id();
    run_ranks(2, [&](int r) { return gpu_options(comm, r, ring); }, [](TransportRank& r) { mixed_exchange(r); });
    EXPECT_TRUE(leftovers(comm).empty()) << joined(leftovers(comm));
  }
  EXPECT_EQ(bt::shm_parts_behind_copies(), 0);
}

namespace {

/// The emulated runtime with a gate in front of every copy: each copy_async first waits
/// on its stream until the test opens the gate, so copies are issued but none has run.
class GatedGpu final : public braid::gpu::Runtime {
 public:
  explicit GatedGpu(braid::gpu::Runtime& rt) : rt_(rt), gate_(static_cast<std::uint32_t*>(rt.alloc_pinned(4))) {
    *gate_ = 0;
  }
  ~GatedGpu() override { rt_.free_pinned(gate_); }
  void open() { rt_.signal(gate_, 1); }
  std::atomic<int> copies{0};

  void copy_async(void* dst, const void* src, std::size_t bytes, braid::gpu::Stream s) override {
    ++copies;
    rt_.wait_value(s, gate_, 1);
    rt_.copy_async(dst, src, bytes, s);
  }
  // The rest as the emulated runtime.
  braid::gpu::Backend backend() const noexcept override { return rt_.backend(); }
  std::string describe() const override { return rt_.describe(); }
  int device_count() const noexcept override { return rt_.device_count(); }
  int current_device() override { return rt_.current_device(); }
  void set_device(int d) override { rt_.set_device(d); }
  braid::gpu::PointerInfo classify(const void* p) override { return rt_.classify(p); }
  bool capturing(braid::gpu::Stream s) override { return rt_.capturing(s); }
  std::string pci_bus_id(int d) override { return rt_.pci_bus_id(d); }
  bool can_access_peer(int d, int p) override { return rt_.can_access_peer(d, p); }
  void* alloc_device(std::size_t n, int d) override { return rt_.alloc_device(n, d); }
  void free_device(void* p) noexcept override { rt_.free_device(p); }
  void* alloc_pinned(std::size_t n) override { return rt_.alloc_pinned(n); }
  void free_pinned(void* p) noexcept override { rt_.free_pinned(p); }
  braid::gpu::Stream create_stream() override { return rt_.create_stream(); }
  void destroy_stream(braid::gpu::Stream s) noexcept override { rt_.destroy_stream(s); }
  void zero_async(void* p, std::size_t n, braid::gpu::Stream s) override { rt_.zero_async(p, n, s); }
  void launch_host(braid::gpu::Stream s, void (*fn)(void*), void* arg) override { rt_.launch_host(s, fn, arg); }
  void wait_value(braid::gpu::Stream s, std::uint32_t* w, std::uint32_t v) override { rt_.wait_value(s, w, v); }
  void signal(std::uint32_t* w, std::uint32_t v) noexcept override { rt_.signal(w, v); }
  void write_value(braid::gpu::Stream s, std::uint32_t* w, std::uint32_t v) override { rt_.write_value(s, w, v); }
  braid::gpu::Event create_event() override { return rt_.create_event(); }
  void destroy_event(braid::gpu::Event e) noexcept override { rt_.destroy_event(e); }
  void record_event(braid::gpu::Event e, braid::gpu::Stream s) override { rt_.record_event(e, s); }
  void wait_event(braid::gpu::Stream s, braid::gpu::Event e) override { rt_.wait_event(s, e); }
  int hw_queues() const noexcept override { return rt_.hw_queues(); }
  void launch_emulated_kernel(braid::gpu::Stream s, void (*fn)(void*), void* arg) override {
    rt_.launch_emulated_kernel(s, fn, arg);
  }
  void load_kernels(int device) override { rt_.load_kernels(device); }
  void synchronize(braid::gpu::Stream s) override { rt_.synchronize(s); }
  void copy(void* dst, const void* src, std::size_t n) override { rt_.copy(dst, src, n); }
  int exchange_capture_mode(int mode) noexcept override { return rt_.exchange_capture_mode(mode); }
  void begin_capture(braid::gpu::Stream s) override { rt_.begin_capture(s); }
  void end_capture(braid::gpu::Stream s) override { rt_.end_capture(s); }
  std::string dmabuf_support(int d) override { return rt_.dmabuf_support(d); }
  int export_dmabuf(const void* p, std::size_t n, std::uintptr_t* b, std::size_t* sz) override {
    return rt_.export_dmabuf(p, n, b, sz);
  }
  void flush_rdma_writes(int d) override { rt_.flush_rdma_writes(d); }
  std::uint64_t rdma_flushes() const noexcept override { return rt_.rdma_flushes(); }
  braid::gpu::IpcHandle ipc_export(const void* p) override { return rt_.ipc_export(p); }
  void* ipc_open(braid::gpu::IpcHandle h, std::size_t n) override { return rt_.ipc_open(std::move(h), n); }
  void ipc_close(void* p) noexcept override { rt_.ipc_close(p); }

 private:
  braid::gpu::Runtime& rt_;
  std::uint32_t* gate_;
};

}  // namespace

// The copy-engine proxy: device parts are copied on a stream, several at once, and a part
// is published (sender) or its slot released (receiver) only once its copy has run. With
// every copy held at a gate, the sender fills every slot it has credit for without
// waiting, the receiver gets nothing, and nothing completes; once the gate opens, both
// complete with the right bytes.
TEST(ShmTransport, DeviceCopiesRunOnAStreamAndThePartsWaitForThem) {
  GatedGpu gpu(emulated_gpu());
  const std::uint64_t comm = fresh_comm_id();
  const std::size_t bytes = 3 * kSlot + 100;  // 4 parts; kSlots = 4 slots of credit
  std::atomic<bool> held_checked{false};
  run_ranks(
      2,
      [&](int r) {
        bt::ShmOptions o = gpu_options(comm, r, true);
        o.gpu = &gpu;
        return o;
      },
      [&](TransportRank& r) {
        r.handshake(1 - r.rank);
        Buf buf(bytes, true);
        bt::Request req;
        if (r.rank == 0) {
          buf.fill(7);
          r.to(1)->send_device(buf.p, bytes, 9, &req);
          // Everything the credits allow is issued, none of it has run: not one part is
          // published, so the send is pending and the receiver has nothing.
          EXPECT_FALSE(r.drive({&req}, 200ms));
          EXPECT_EQ(bt::shm_parts_behind_copies(), kSlots) << "parts issued without waiting for each other's copy";
          EXPECT_EQ(gpu.copies.load(), kSlots);
          held_checked = true;
          gpu.open();
          ASSERT_TRUE(r.drive({&req}, kDeadline));
          EXPECT_EQ(req.state, State::done) << req.error;
        } else {
          r.to(0)->recv_device(buf.p, bytes, 9, &req);
          while (!held_checked) {
            r.step();
            EXPECT_EQ(req.state, State::pending) << "a part was received before its copy ran";
          }
          ASSERT_TRUE(r.drive({&req}, kDeadline));
          EXPECT_EQ(req.state, State::done) << req.error;
          EXPECT_TRUE(buf.holds(7));
        }
      });
  EXPECT_EQ(bt::shm_parts_behind_copies(), 0);
  EXPECT_TRUE(leftovers(comm).empty()) << joined(leftovers(comm));
}

TEST(ShmTransport, GpuBuffersCrossProcessesThroughTheMappedDeviceRing) {
  // Processes: hi maps lo's device ring (the emulated IPC handle names lo's memfd).
  const std::uint64_t comm = fresh_comm_id();
  run_process_ranks(
      2, [&](int r) -> bt::CommonOptions { return gpu_options(comm, r, true); },
      [&](const bt::CommonOptions& c, bt::Poller& p, bt::PeerDirectory& d) {
        return bt::make_shm_transport(gpu_options(comm, c.rank, true), p, d);
      },
      [](TransportRank& r) {
        mixed_exchange(r);
        // Every test buffer is freed: what is left of the emulated GPU memory in this process
        // is the pair's device ring, lo's own allocation and hi's mapping of it (a silent
        // fallback to the host ring would leave hi without one).
        std::ifstream maps("/proc/self/maps");
        int rings = 0;
        for (std::string line; std::getline(maps, line);) rings += line.find("braid-emulated-device") != std::string::npos ? 1 : 0;
        EXPECT_EQ(rings, 1) << "rank " << r.rank << ": the device ring is not mapped here";
      });
  EXPECT_TRUE(leftovers(comm).empty()) << joined(leftovers(comm));
}

TEST(ShmTransport, WithoutAGpuConnectionsTakeHostMemoryOnly) {
  const std::uint64_t comm = fresh_comm_id();
  run_ranks(2, [&](int r) { return options(comm, r, 2); }, [](TransportRank& r) {
    EXPECT_FALSE(r.to(1 - r.rank)->takes_device_memory());
    EXPECT_THROW(r.to(1 - r.rank)->send_device(nullptr, 0, 1, nullptr), braid::Error);
  });
}
