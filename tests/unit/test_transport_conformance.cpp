// The transport conformance suite: the contract of transport.hpp, checked for every
// transport in the registry (UCX's test style: one suite, instantiated per transport), with
// ranks as threads and as forked processes. A transport added to registry.cpp runs these
// tests with its default configuration rows and no other change; extra_shapes() adds the
// configurations that exercise a transport's own machinery harder (striping over several
// sockets, messages spanning many ring slots).
//
// What each transport has alone (wire formats, striping layout, segments and doorbells,
// interface selection) stays in its own suite (test_tcp_transport.cpp, test_shm_transport.cpp).
#include "base/settings.hpp"
#include "transport/registry.hpp"
#include "transport_harness.hpp"

#include <braid/error.hpp>

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace braid::test;
using namespace std::chrono_literals;

namespace {

/// A registered transport with some of its configuration rows set.
struct Shape {
  std::string transport;
  std::map<std::string, std::string> settings;
  std::string label;  ///< the test name suffix
};
void PrintTo(const Shape& s, std::ostream* os) { *os << s.label; }

/// Shapes beyond each transport's defaults.
std::vector<Shape> extra_shapes() {
  return {
      {"tcp", {{"BRAID_SOCKETS_PER_PEER", "4"}}, "tcp_4_sockets"},
      {"shm", {{"BRAID_SHM_SLOT_BYTES", "64K"}, {"BRAID_SHM_SLOTS", "4"}}, "shm_4_slots_of_64K"},
  };
}

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (const bt::TransportEntry* e : bt::registry()) out.push_back({e->name, {}, e->name});
  for (Shape& s : extra_shapes())
    if (bt::find_transport(s.transport) != nullptr) out.push_back(std::move(s));
  return out;
}

/// Makes the shape's transport through its registry entry, as the engine does.
TransportFactory factory(const Shape& shape) { return entry_factory(shape.transport, shape.settings); }

enum class Ranks { threads, processes };

class Conformance : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    make_ = factory(GetParam());
    comm_ = fresh_comm_id();
  }
  std::function<bt::CommonOptions(int)> options(int size) const {
    const std::uint64_t comm = comm_;
    return [=](int r) { return common_options(r, size, comm); };
  }
  void run(Ranks how, int size, const std::function<void(TransportRank&)>& fn) const {
    if (how == Ranks::threads) {
      run_thread_ranks(size, options(size), make_, fn);
    } else {
      run_process_ranks(size, options(size), make_, fn);
    }
  }
  /// One rank in this thread, for tests that drive ranks by hand.
  std::unique_ptr<TransportRank> rank(bt::PeerDirectory& d, const bt::CommonOptions& o) const {
    return std::make_unique<TransportRank>(d, o, make_);
  }
  bt::CommonOptions opts(int r, int size) const { return common_options(r, size, comm_); }

  TransportFactory make_;
  std::uint64_t comm_ = 0;
};

// ---------------------------------------------------------------------------
// Data: every size, FIFO order both ways at once, every pair of a world.

/// Rank 0 sends every size, rank 1 checks it and echoes it back, rank 0 checks the echo.
void ping_pong(TransportRank& r) {
  static const std::vector<std::size_t> sizes = {0,         1,          4097,           65535,    65536,
                                                 65537,     3 * 65536 + 7, (512 << 10) + 1, 4 << 20,
                                                 (8 << 20) + 3};
  bt::Connection* c = r.to(1 - r.rank);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::size_t n = sizes[i];
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

TEST_P(Conformance, PingPongOfEverySizeArrivesIntact) {
  run(Ranks::threads, 2, ping_pong);
  run(Ranks::processes, 2, ping_pong);
}

/// Both sides post 160 messages each way (up to 8 MiB) before anything moves; each side's
/// sends and receives complete in the order posted, with the right bytes.
void fifo_both_ways(TransportRank& r) {
  constexpr int kCount = 160;
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
  const auto deadline = Clock::now() + kTransportDeadline;
  bool pending = true;
  while (pending && Clock::now() < deadline) {
    r.step();
    expect_in_order(sends, "send");
    expect_in_order(recvs, "recv");
    pending = false;
    for (auto* q : all) pending = pending || q->state == State::pending;
  }
  ASSERT_FALSE(pending) << "deadline passed";
  for (int i = 0; i < kCount; ++i) {
    ASSERT_DONE(sends[i]);
    ASSERT_DONE(recvs[i]);
    EXPECT_TRUE(in[i] == pattern(fifo_size(i), static_cast<std::uint64_t>(peer * 1000 + i)))
        << "message " << i << " (" << fifo_size(i) << " bytes) differs";
  }
}

TEST_P(Conformance, ManyMessagesBothWaysAtOnceKeepFifoOrder) {
  run(Ranks::threads, 2, fifo_both_ways);
  run(Ranks::processes, 2, fifo_both_ways);
}

/// Every rank sends a distinct message to every other and receives one from each.
std::function<void(TransportRank&)> every_pair(int size) {
  return [size](TransportRank& r) {
    auto bytes = [](int from, int to) { return std::size_t{150000} + static_cast<std::size_t>(from * 1000 + to); };
    std::vector<std::vector<std::uint8_t>> out(static_cast<std::size_t>(size)), in(out.size());
    std::vector<bt::Request> sends(out.size()), recvs(out.size());
    std::vector<bt::Request*> all;
    for (int p = 0; p < size; ++p) {
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
    for (int p = 0; p < size; ++p) {
      if (p == r.rank) continue;
      const auto i = static_cast<std::size_t>(p);
      EXPECT_DONE(sends[i]);
      EXPECT_DONE(recvs[i]);
      EXPECT_TRUE(in[i] == pattern(bytes(p, r.rank), static_cast<std::uint64_t>(p * 100 + r.rank)))
          << "from rank " << p;
    }
  };
}

TEST_P(Conformance, EveryPairOfAWorldExchangesMessages) {
  run(Ranks::threads, 3, every_pair(3));
  run(Ranks::processes, 4, every_pair(4));
}

TEST_P(Conformance, UnmatchedMessageDoesNotKeepWakingTheReceiver) {
  // A message whose receive is not posted waits (in the kernel or the ring), and the
  // receiver's poller goes quiet instead of reporting it over and over.
  std::atomic<bool> sent{false}, checked{false};
  const auto data = pattern(60000, 5);
  run(Ranks::threads, 2, [&](TransportRank& r) {
    bt::Connection* c = r.to(1 - r.rank);
    if (r.rank == 0) {
      bt::Request s;
      c->send(data.data(), data.size(), 1, &s);
      ASSERT_TRUE(r.drive({&s}));
      ASSERT_DONE(s);
      sent = true;
      return;
    }
    const auto deadline = Clock::now() + kTransportDeadline;
    while (!sent && Clock::now() < deadline) r.step();
    r.step_for(200ms);  // let the bytes land and a header be read
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
// Tags and sizes: a mismatch fails the receive, names both sides, and breaks the connection.

TEST_P(Conformance, TagMismatchFailsTheReceiveNamingBothTags) {
  run(Ranks::threads, 2, [&](TransportRank& r) {
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
    bt::Request later;  // the connection is failed for good: a later request fails at once
    c->recv(buf.data(), buf.size(), 7, &later);
    EXPECT_EQ(later.state, State::failed);
    std::string why;
    EXPECT_TRUE(c->broken(&why));
    EXPECT_TRUE(contains(why, "expected tag 8")) << why;
  });
}

TEST_P(Conformance, SizeMismatchFailsTheReceiveNamingBothSizes) {
  const std::vector<std::pair<std::size_t, std::size_t>> cases = {
      {100, 200}, {200, 100}, {std::size_t{512} << 10, std::size_t{1} << 20}, {std::size_t{1} << 20, 65536},
      {65536, (std::size_t{1} << 20) | 1}};
  for (const auto& [sent_bytes, recv_bytes] : cases) {
    SCOPED_TRACE("sent " + std::to_string(sent_bytes) + ", posted " + std::to_string(recv_bytes));
    run(Ranks::threads, 2, [&](TransportRank& r) {
      std::vector<std::uint8_t> buf(std::max(sent_bytes, recv_bytes), 3);
      bt::Connection* c = r.to(1 - r.rank);
      // A matching message first, so that the bad one is not the connection's first.
      std::uint8_t one = 1;
      bt::Request first;
      if (r.rank == 0) {
        bt::Request s;
        c->send(&one, 1, 4, &first);
        c->send(buf.data(), sent_bytes, 5, &s);
        r.drive({&first, &s}, 5s);  // may stay pending or fail once the receiver gives up
        return;
      }
      // The good message is received before the bad one is posted: with several sockets
      // the bad header may arrive first (its socket connected sooner), and then failing
      // the connection rightly takes the earlier, still pending receive with it.
      c->recv(&one, 1, 4, &first);
      ASSERT_TRUE(r.drive({&first}));
      EXPECT_DONE(first);
      bt::Request q;
      c->recv(buf.data(), recv_bytes, 5, &q);
      ASSERT_TRUE(r.drive({&q}));
      ASSERT_EQ(q.state, State::failed);
      const std::string want = "expected tag 5 and " + std::to_string(recv_bytes) + " bytes, got tag 5 and " +
                               std::to_string(sent_bytes) + " bytes";
      EXPECT_TRUE(contains(q.error, want)) << q.error;
      EXPECT_EQ(q.failed_peer, 0);
      EXPECT_FALSE(q.peer_closed);
    });
  }
}

// ---------------------------------------------------------------------------
// Peers that go away.

TEST_P(Conformance, KilledPeerFailsPendingRequestsWithinASecondNamingIt) {
  for (const int killed : {0, 1}) {  // the rank that connects, and the one that accepts
    SCOPED_TRACE("rank " + std::to_string(killed) + " is killed");
    const int survivor = 1 - killed;
    TempDir tmp;
    std::fflush(nullptr);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      int code = 0;
      {
        FileDirectory d(tmp.path, killed);
        auto r = rank(d, opts(killed, 2));
        r->handshake(survivor);
        if (::testing::Test::HasFailure()) code = 1;
        const auto deadline = Clock::now() + kTransportDeadline;
        while (Clock::now() < deadline) r->step(100);  // wait to be killed
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    FileDirectory d(tmp.path, survivor);
    auto r = rank(d, opts(survivor, 2));
    r->handshake(killed);
    // A receive, and a send larger than any ring or socket buffer: both stay pending.
    std::vector<std::uint8_t> in(4096), out(std::size_t{48} << 20, 7);
    bt::Request q, s;
    r->to(killed)->recv(in.data(), in.size(), 2, &q);
    r->to(killed)->send(out.data(), out.size(), 3, &s);
    r->step_for(50ms);
    ASSERT_EQ(q.state, State::pending);
    ASSERT_EQ(s.state, State::pending);
    const auto t0 = Clock::now();
    ::kill(child, SIGKILL);
    const bool failed = r->drive({&q, &s}, 5s, 100);  // long sleeps: the death itself must wake us
    const double took = ms_since(t0);
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(failed) << "the requests still pend 5 s after the peer died";
    EXPECT_LT(took, 1000.0);
    for (const bt::Request* x : {&q, &s}) {
      ASSERT_EQ(x->state, State::failed);
      EXPECT_TRUE(x->peer_closed) << x->error;
      EXPECT_EQ(x->failed_peer, killed);
      EXPECT_TRUE(contains(x->error, "connection to rank " + std::to_string(killed))) << x->error;
      EXPECT_TRUE(contains(x->error, "closed by peer") || contains(x->error, "reset")) << x->error;
    }
    r->transport->close_all("test over");
    std::printf("[ info ] %s: rank %d noticed the death of rank %d after %.1f ms\n", GetParam().label.c_str(),
                survivor, killed, took);
  }
}

TEST_P(Conformance, PeerClosedWhileIdleIsReportedOnTheNextRequest) {
  MemDirectory dir;
  std::atomic<bool> gone{false};
  bt::Request later_recv, later_send;
  bool broken = false;
  std::string why;
  std::thread t0([&] {
    RankDirectory d(dir, 0);
    auto r = rank(d, opts(0, 2));
    std::uint32_t v = 1;
    bt::Request s;
    r->to(1)->send(&v, sizeof v, 1, &s);
    EXPECT_TRUE(r->drive({&s}));
    r->step_for(50ms);
    r.reset();
    gone = true;
  });
  std::thread t1([&] {
    RankDirectory d(dir, 1);
    auto r = rank(d, opts(1, 2));
    std::uint32_t v = 0;
    bt::Request g;
    r->to(0)->recv(&v, sizeof v, 1, &g);
    EXPECT_TRUE(r->drive({&g}));
    EXPECT_DONE(g);
    const auto deadline = Clock::now() + kTransportDeadline;
    while (!gone && Clock::now() < deadline) r->step();
    r->step_for(100ms);  // the close arrives while nothing is pending
    broken = r->to(0)->broken(&why);
    r->to(0)->recv(&v, sizeof v, 2, &later_recv);
    r->to(0)->send(&v, sizeof v, 2, &later_send);
    r->drive({&later_recv, &later_send}, 5s);
  });
  t0.join();
  t1.join();
  EXPECT_TRUE(broken) << "broken() does not report a closed peer";
  EXPECT_TRUE(contains(why, "closed by peer")) << why;
  for (const bt::Request* x : {&later_recv, &later_send}) {
    ASSERT_EQ(x->state, State::failed);
    EXPECT_TRUE(x->peer_closed) << x->error;
    EXPECT_EQ(x->failed_peer, 0);
    EXPECT_TRUE(contains(x->error, "closed by peer")) << x->error;
  }
}

TEST_P(Conformance, AFailingPeerSaysWhyBeforeItCloses) {
  // Rank 1 fails (as the engine does: tell_peers, then close_all) while rank 0 waits on it.
  // tcp, shm and ucx carry its words and blame to rank 0 without any store; ibverbs (not
  // yet) reports the close alone.
  const bool tells = GetParam().transport != "ibverbs";
  MemDirectory dir;
  std::atomic<bool> posted{false}, gone{false};
  bt::Request pending;
  std::thread t1([&] {
    RankDirectory d(dir, 1);
    auto r = rank(d, opts(1, 3));
    std::uint32_t v = 1;
    bt::Request s;
    r->to(0)->send(&v, sizeof v, 1, &s);
    EXPECT_TRUE(r->drive({&s}));
    const auto deadline = Clock::now() + kTransportDeadline;
    while (!posted && Clock::now() < deadline) r->step();
    r->step_for(20ms);
    r->transport->tell_peers(2, "braid Timeout: allreduce #7 timed out waiting on rank 2");
    r->transport->close_all("rank 1 failed");
    gone = true;
  });
  RankDirectory d(dir, 0);
  auto r = rank(d, opts(0, 3));
  std::uint32_t v = 0;
  bt::Request g;
  r->to(1)->recv(&v, sizeof v, 1, &g);
  ASSERT_TRUE(r->drive({&g}));
  ASSERT_DONE(g);
  r->to(1)->recv(&v, sizeof v, 2, &pending);
  posted = true;
  EXPECT_TRUE(r->drive({&pending}, 10s)) << "the close was not seen";
  t1.join();
  ASSERT_EQ(pending.state, State::failed);
  EXPECT_TRUE(pending.peer_closed) << pending.error;
  if (tells) {
    EXPECT_TRUE(pending.peer_told) << pending.error;
    EXPECT_TRUE(contains(pending.error, "rank 1 said before closing: allreduce #7 timed out waiting on rank 2"))
        << pending.error;
    EXPECT_EQ(pending.failed_peer, 2) << "the rank the failing peer blamed";
  } else {
    EXPECT_FALSE(pending.peer_told);
    EXPECT_EQ(pending.failed_peer, 1);
  }
}

TEST_P(Conformance, CloseAllFailsPendingRequestsAndIsIdempotent) {
  MemDirectory dir;
  RankDirectory d(dir, 1);
  auto r = rank(d, opts(1, 2));  // the acceptor: no lookup, the receive just waits
  std::uint64_t v = 0;
  bt::Request q;
  r->to(0)->recv(&v, sizeof v, 1, &q);
  r->step_for(20ms);
  EXPECT_EQ(q.state, State::pending);
  r->transport->close_all("aborted by test");
  ASSERT_EQ(q.state, State::failed);
  EXPECT_EQ(q.error, "aborted by test");
  EXPECT_EQ(q.failed_peer, -1);
  r->transport->close_all("again");
  bt::Request later;
  r->to(0)->send(&v, sizeof v, 1, &later);
  ASSERT_EQ(later.state, State::failed);
  EXPECT_EQ(later.error, "aborted by test");
  EXPECT_FALSE(r->transport->progress());
}

// ---------------------------------------------------------------------------
// Set-up: late peers, missing peers, strangers.

TEST_P(Conformance, LatePeerIsFoundWithoutBlockingProgress) {
  MemDirectory dir;
  std::uint64_t v = 42, got = 0;
  bt::Request s, q;
  std::thread late([&] {
    std::this_thread::sleep_for(300ms);
    RankDirectory d1(dir, 1);
    auto r1 = rank(d1, opts(1, 2));
    r1->to(0)->recv(&got, sizeof got, 7, &q);
    EXPECT_TRUE(r1->drive({&q}, 10s));
  });
  RankDirectory d0(dir, 0);
  auto r0 = rank(d0, opts(0, 2));
  r0->to(1)->send(&v, sizeof v, 7, &s);
  Clock::duration longest{0};
  const auto start = Clock::now();
  const auto deadline = start + 10s;
  while (s.state == State::pending && Clock::now() < deadline) {
    const auto t0 = Clock::now();
    r0->transport->progress();
    longest = std::max(longest, Clock::now() - t0);
    // The peer may finish and close its sockets right after our send completes: then
    // nothing would wake a further sleep.
    if (s.state != State::pending) break;
    // Long waits: only the transport's own timer wakes the poller for lookups.
    if (r0->transport->prepare_sleep()) r0->poller.wait(5000);
  }
  late.join();
  EXPECT_EQ(s.state, State::done) << s.error;
  EXPECT_EQ(got, 42u);
  // A progress() that waited for the missing peer would last until it came (300 ms); 200 ms
  // tells that apart and leaves room for a loaded 2-core machine (50 ms failed there now
  // and then, a descheduled thread in the middle of ucp_ep_create).
  EXPECT_LT(longest, 200ms) << "progress() blocked while the peer's address was missing";
  EXPECT_LT(Clock::now() - start, 3s) << "the retry timer did not wake the poller";
}

TEST_P(Conformance, MissingPeerFailsTheRequestAtTheConnectTimeout) {
  MemDirectory dir;
  RankDirectory d(dir, 0);
  auto o = opts(0, 2);
  o.connect_timeout = 100ms;
  auto r = rank(d, o);
  std::uint64_t v = 0;
  bt::Request q;
  const auto t0 = Clock::now();
  r->to(1)->send(&v, sizeof v, 1, &q);
  ASSERT_TRUE(r->drive({&q}, 5s, 1000));  // long sleeps: the transport's timer must wake us
  ASSERT_EQ(q.state, State::failed);
  EXPECT_LT(ms_since(t0), 1000.0);
  EXPECT_TRUE(contains(q.error, "cannot connect to rank 1")) << q.error;
  EXPECT_TRUE(contains(q.error, "within 100 ms")) << q.error;
  EXPECT_EQ(q.failed_peer, 1);
}

TEST_P(Conformance, StrangersAreRefusedAndReportedWithoutDisturbingTheListener) {
  // A connector with another token, then one of another communicator: the listener
  // refuses both (reporting them through on_refused), its own receive stays untouched,
  // and each stranger's receive fails instead of hanging.
  for (const bool other_comm : {false, true}) {
    SCOPED_TRACE(other_comm ? "another communicator" : "another token");
    MemDirectory dir;
    std::atomic<int> refused{0};
    std::string refusal;
    std::mutex mu;
    auto o1 = opts(1, 2);
    // The listener waits for its real peer longer than the stranger waits for it (a
    // transport without listening sockets, ibverbs, finds peers through their records and
    // refuses a stranger's record while it keeps waiting for the real one).
    o1.connect_timeout = 60s;
    o1.on_refused = [&](const std::string& why) {
      std::lock_guard<std::mutex> g(mu);
      refusal = why;
      ++refused;
    };
    RankDirectory d1(dir, 1);
    auto listener = rank(d1, o1);
    std::uint64_t v = 0;
    bt::Request q;
    listener->to(0)->recv(&v, sizeof v, 1, &q);

    auto o0 = opts(0, 2);
    if (other_comm) {
      o0.comm_id ^= 0x5555;
    } else {
      o0.auth_token = "not-the-token";
    }
    o0.connect_timeout = 3s;
    std::atomic<bool> stop{false};
    std::thread serve([&] {
      while (!stop) listener->step();
    });
    RankDirectory d0(dir, 0);
    auto stranger = rank(d0, o0);
    std::uint64_t w = 7, back = 0;
    bt::Request s, g;
    stranger->to(1)->send(&w, sizeof w, 1, &s);
    stranger->to(1)->recv(&back, sizeof back, 1, &g);
    const bool ended = stranger->drive({&s, &g}, 15s);
    const auto deadline = Clock::now() + 5s;
    while (refused.load() == 0 && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
    stop = true;
    serve.join();
    EXPECT_TRUE(ended) << "the stranger's requests still pend";
    // Its send may have left its buffer before the refusal (done); its receive cannot complete.
    EXPECT_EQ(g.state, State::failed);
    EXPECT_EQ(g.failed_peer, 1) << g.error;
    EXPECT_GE(refused.load(), 1) << "the refusal was not reported";
    EXPECT_TRUE(contains(refusal, "refused")) << refusal;
    EXPECT_EQ(q.state, State::pending) << "the listener's own receive was disturbed: " << q.error;
    listener->transport->close_all("test over");
  }
}

TEST_P(Conformance, InvalidPeersAndNullBuffersAreRejected) {
  MemDirectory dir;
  RankDirectory d(dir, 1);
  auto r = rank(d, opts(1, 3));
  for (const int peer : {-1, 1, 3}) {
    try {
      r->to(peer);
      ADD_FAILURE() << "connection(" << peer << ") was accepted";
    } catch (const braid::Error& e) {
      EXPECT_EQ(e.code(), braid::ErrorCode::InvalidUsage);
      EXPECT_TRUE(contains(e.what(), "rank " + std::to_string(peer))) << e.what();
    }
  }
  bt::Request q;
  EXPECT_THROW(r->to(0)->send(nullptr, 8, 1, &q), braid::Error);
  EXPECT_THROW(r->to(0)->recv(nullptr, 8, 1, &q), braid::Error);
  std::uint64_t v = 0;
  EXPECT_THROW(r->to(0)->recv(&v, sizeof v, 1, nullptr), braid::Error);
  r->transport->close_all("test over");
}

INSTANTIATE_TEST_SUITE_P(EveryTransport, Conformance, ::testing::ValuesIn(shapes()),
                         [](const ::testing::TestParamInfo<Shape>& p) { return p.param.label; });

}  // namespace
