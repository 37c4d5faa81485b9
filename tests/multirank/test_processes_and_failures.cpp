// Ranks as forked processes (FileStore and TcpStore bootstrap), bad arguments,
// deadlines, abort(), and a rank killed in the middle of an all-reduce.
#include "test_support.hpp"

#include <braid/braid.hpp>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace braid;
using namespace std::chrono_literals;
using braid::test::run_processes;
using braid::test::run_processes_ok;
using braid::test::run_threads;

namespace {

std::uint64_t fnv1a(const void* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
  return h;
}

// Every process: f32/bf16/i32 x every op, compare a hash of its result with every
// other rank's through the store (bitwise identical), and integer results exactly.
TEST(Processes, AllreduceOverFileStoreIsBitwiseIdentical) {
  for (int n : {1, 2, 3, 5, 8}) {
    const std::string path = braid::test::temp_path("fstore");
    run_processes_ok(n, [&](int r) {
      auto store = std::make_shared<FileStore>(path);
      CommOptions opt;
      opt.timeout = 60s;
      opt.chunk_bytes = 8192;
      Communicator c(store, r, n, opt);
      int k = 0;
      for (DataType t : {DataType::f32, DataType::bf16, DataType::i32})
        for (int oi = 0; oi <= static_cast<int>(ReduceOp::avg); ++oi) {
          const auto op = static_cast<ReduceOp>(oi);
          const std::size_t count = 40000 + static_cast<std::size_t>(k);
          std::vector<std::int32_t> ibuf(count);
          std::vector<std::byte> buf(count * dtype_size(t));
          for (std::size_t i = 0; i < count; ++i) {
            const int v = static_cast<int>((i * 31 + static_cast<std::size_t>(r) * 17) % 7) - 3;
            if (t == DataType::i32) reinterpret_cast<std::int32_t*>(buf.data())[i] = op == ReduceOp::prod ? (v > 0 ? 2 : -1) : v;
            if (t == DataType::f32) reinterpret_cast<float*>(buf.data())[i] = static_cast<float>(v) * 0.37f;
            if (t == DataType::bf16) reinterpret_cast<std::uint16_t*>(buf.data())[i] = static_cast<std::uint16_t>(0x3f80 + v);
          }
          c.allreduce(buf.data(), buf.data(), count, t, op).wait();
          const std::uint64_t h = fnv1a(buf.data(), buf.size());
          store->set("hash/" + std::to_string(k) + "/" + std::to_string(r), std::to_string(h));
          const std::string h0 = store->get("hash/" + std::to_string(k) + "/0", 60s);
          EXPECT_EQ(h0, std::to_string(h)) << "rank " << r << " differs from rank 0 in case " << k;
          if (t == DataType::i32 && op == ReduceOp::sum) {
            for (std::size_t i = 0; i < count; ++i) {
              int want = 0;
              for (int q = 0; q < n; ++q) want += static_cast<int>((i * 31 + static_cast<std::size_t>(q) * 17) % 7) - 3;
              ASSERT_EQ(reinterpret_cast<std::int32_t*>(buf.data())[i], want) << "element " << i;
            }
          }
          ++k;
        }
    });
    std::remove(path.c_str());
  }
}

TEST(Processes, AllreduceOverTcpStoreServedByRankZero) {
  std::uint16_t port = 0;
  {  // find a free port, then free it for rank 0 to serve on
    TcpStoreServer probe("127.0.0.1", 0);
    port = probe.port();
  }
  run_processes_ok(4, [&](int r) {
    auto store = std::make_shared<TcpStore>("127.0.0.1", port, r == 0, 30s);
    Communicator c(store, r, 4);
    std::vector<double> x(100003, r + 0.5);
    c.allreduce(x.data(), x.data(), x.size(), DataType::f64, ReduceOp::sum).wait();
    for (double v : x) ASSERT_EQ(v, 8.0);
  });
}

// ---- bad arguments: InvalidUsage / Unsupported before any byte moves ---------------

TEST(Arguments, RejectedBeforeAnythingMoves) {
  // A one-rank communicator is enough: errors must come from the call itself.
  auto store = std::make_shared<TcpStore>("127.0.0.1", 0, true);
  Communicator c(store, 0, 1);
  float a[8] = {}, b[8] = {};
  auto code_of = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::Internal;
  };
  EXPECT_EQ(code_of([&] { c.allreduce(nullptr, b, 8, DataType::f32, ReduceOp::sum); }), ErrorCode::InvalidUsage);
  EXPECT_EQ(code_of([&] { c.allreduce(a, nullptr, 8, DataType::f32, ReduceOp::sum); }), ErrorCode::InvalidUsage);
  EXPECT_EQ(code_of([&] { c.allreduce(a, a + 1, 4, DataType::f32, ReduceOp::sum); }), ErrorCode::InvalidUsage);
  EXPECT_EQ(code_of([&] { c.allreduce(a, b, SIZE_MAX / 2, DataType::f32, ReduceOp::sum); }), ErrorCode::InvalidUsage);
  // The v-collectives: one count per rank, sums that fit, blocks that fit the address space,
  // the in-place conventions, and a rank's own alltoallv block the same both ways.
  EXPECT_EQ(code_of([&] { c.allgatherv(a, b, {1, 1}, DataType::f32); }), ErrorCode::InvalidUsage);
  EXPECT_EQ(code_of([&] { c.allgatherv(a, b, {SIZE_MAX / 2}, DataType::f32); }), ErrorCode::InvalidUsage);
  EXPECT_EQ(code_of([&] { c.allgatherv(a + 1, a, {4}, DataType::f32); }), ErrorCode::InvalidUsage);
  EXPECT_EQ(code_of([&] { c.reduce_scatter_v(a, a + 1, {4}, DataType::f32, ReduceOp::sum); }), ErrorCode::InvalidUsage);
  EXPECT_EQ(code_of([&] { c.alltoallv(a, {2}, b, {3}, DataType::f32); }), ErrorCode::InvalidUsage);
  EXPECT_EQ(code_of([&] { c.alltoallv(a, {SIZE_MAX, 1}, b, {1}, DataType::f32); }), ErrorCode::InvalidUsage);
  ReduceScatterOptions det;
  det.deterministic = true;
  EXPECT_EQ(code_of([&] { c.reduce_scatter_v(a, b, {4}, DataType::f32, ReduceOp::sum, det); }), ErrorCode::Unsupported);
  AllreduceOptions half;
  half.scale = 0.5;
  std::int32_t ints[4] = {};
  EXPECT_EQ(code_of([&] { c.allreduce(ints, ints, 4, DataType::i32, ReduceOp::premul_sum, half); }),
            ErrorCode::InvalidUsage);
  EXPECT_NO_THROW(c.allgatherv(a, a, {8}, DataType::f32).wait());  // in place: the one block is the output
  EXPECT_EQ(code_of([&] { c.allreduce(a, b, 8, static_cast<DataType>(42), ReduceOp::sum); }), ErrorCode::InvalidUsage);
  EXPECT_EQ(code_of([&] { c.allreduce(a, b, 8, DataType::f32, static_cast<ReduceOp>(9)); }), ErrorCode::InvalidUsage);
  AllreduceOptions neg;
  neg.timeout = std::chrono::milliseconds(-1);
  EXPECT_EQ(code_of([&] { c.allreduce(a, b, 8, DataType::f32, ReduceOp::sum, neg); }), ErrorCode::InvalidUsage);
  AllreduceOptions codec;
  codec.codec = "int9";
  EXPECT_EQ(code_of([&] { c.allreduce(a, b, 8, DataType::f32, ReduceOp::sum, codec); }), ErrorCode::InvalidUsage);
  codec.codec = "int8";
  double d[8] = {};
  EXPECT_EQ(code_of([&] { c.allreduce(d, d, 8, DataType::f64, ReduceOp::sum, codec); }), ErrorCode::InvalidUsage);
  codec.codec = "sign1";  // biased without error feedback
  EXPECT_EQ(code_of([&] { c.allreduce(a, b, 8, DataType::f32, ReduceOp::sum, codec); }), ErrorCode::InvalidUsage);
  AllreduceOptions bogus;
  bogus.algorithm = static_cast<Algorithm>(42);
  EXPECT_EQ(code_of([&] { c.allreduce(a, b, 8, DataType::f32, ReduceOp::sum, bogus); }), ErrorCode::InvalidUsage);
  BroadcastOptions bad_root;
  bad_root.root = 1;
  EXPECT_EQ(code_of([&] { c.broadcast(a, b, 8, DataType::f32, bad_root); }), ErrorCode::InvalidUsage);
  ReduceOptions neg_root;
  neg_root.root = -1;
  EXPECT_EQ(code_of([&] { c.reduce(a, b, 8, DataType::f32, ReduceOp::sum, neg_root); }), ErrorCode::InvalidUsage);
  // allgather in place means send == recv + rank*count; a shifted overlap is refused.
  EXPECT_EQ(code_of([&] { c.allgather(b + 1, b, 4, DataType::f32); }), ErrorCode::InvalidUsage);
  EXPECT_EQ(code_of([&] { c.reduce_scatter(a, a + 1, 4, DataType::f32, ReduceOp::sum); }), ErrorCode::InvalidUsage);
  EXPECT_EQ(code_of([&] { c.recv(a, 4, DataType::f32, 3); }), ErrorCode::InvalidUsage);  // no such rank
  EXPECT_EQ(code_of([&] { c.split(-1, 0); }), ErrorCode::InvalidUsage);
  // Null buffers with count 0 are fine, and the communicator is still healthy.
  c.allreduce(nullptr, nullptr, 0, DataType::f32, ReduceOp::sum).wait();
  a[0] = 5;
  c.allreduce(a, b, 8, DataType::f32, ReduceOp::avg).wait();
  EXPECT_EQ(b[0], 5.f);
  EXPECT_FALSE(c.failed());
  EXPECT_THROW(Communicator(store, 1, 1), Error);
  EXPECT_THROW(Communicator(nullptr, 0, 1), Error);
}

// ---- deadlines and abort ----------------------------------------------------------

TEST(Failures, DeadlineFailsWithTimeoutAndCommunicatorFailsFast) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  const auto port = server->port();
  std::atomic<bool> rank0_done{false};
  run_threads(2, [&](int r) {
    Communicator c(std::make_shared<TcpStore>("127.0.0.1", port), r, 2);
    if (r == 1) {  // never joins the collective; waits until rank 0 has given up
      while (!rank0_done) std::this_thread::sleep_for(5ms);
      return;
    }
    float x = 1;
    AllreduceOptions o;
    o.timeout = 300ms;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c.allreduce(&x, &x, 1, DataType::f32, ReduceOp::sum, o).wait();
      ADD_FAILURE() << "allreduce without a peer completed";
    } catch (const TimeoutError& e) {
      const auto dt = std::chrono::steady_clock::now() - t0;
      EXPECT_LT(dt, 3s);
      EXPECT_NE(std::string(e.what()).find("allreduce #1"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(c.failed());
    try {
      c.allreduce(&x, &x, 1, DataType::f32, ReduceOp::sum).wait();
      ADD_FAILURE() << "a failed communicator accepted work";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::Aborted);
    }
    rank0_done = true;
  });
}

TEST(Failures, AbortUnblocksAWaiter) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  const auto port = server->port();
  std::atomic<bool> done{false};
  run_threads(2, [&](int r) {
    Communicator c(std::make_shared<TcpStore>("127.0.0.1", port), r, 2);
    if (r == 1) {
      while (!done) std::this_thread::sleep_for(5ms);
      return;
    }
    std::vector<float> x(1000, 1.f);
    auto w = c.allreduce(x.data(), x.data(), x.size(), DataType::f32, ReduceOp::sum);
    std::promise<std::exception_ptr> called;  // Work::on_complete gets the failure too
    w.on_complete([&](std::exception_ptr e) { called.set_value(e); });
    std::thread killer([&] {
      std::this_thread::sleep_for(100ms);
      c.abort();
    });
    const auto t0 = std::chrono::steady_clock::now();
    try {
      w.wait();
      ADD_FAILURE() << "aborted work completed";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::Aborted) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
    EXPECT_TRUE(w.test());
    EXPECT_NE(w.exception(), nullptr);
    auto f = called.get_future();
    ASSERT_EQ(f.wait_for(5s), std::future_status::ready) << "no completion callback after abort()";
    EXPECT_EQ(f.get(), w.exception());
    killer.join();
    done = true;
  });
}

// ---- Work::on_complete ----------------------------------------------------------------

// Callbacks run once, in the order added, after the result is in place; one of them posts
// the next collective (chaining, as c10d's Future::then); a callback added to a finished
// Work runs at once on the caller's thread; one that throws is dropped without harm.
TEST(WorkCallbacks, RunOnceInOrderAndMayPostTheNextCollective) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  const auto port = server->port();
  run_threads(2, [&](int r) {
    Communicator c(std::make_shared<TcpStore>("127.0.0.1", port), r, 2);
    std::vector<float> x(1 << 16, 1.0f), y(1 << 16, 2.0f);
    std::mutex mu;
    std::vector<int> order;
    std::promise<Work> next;
    auto w = c.allreduce(x.data(), x.data(), x.size(), DataType::f32, ReduceOp::sum);
    w.on_complete([&](std::exception_ptr e) {
      EXPECT_EQ(e, nullptr);
      EXPECT_EQ(x[0], 2.0f) << "the callback ran before the result was in place";
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(1);
    });
    w.on_complete([](std::exception_ptr) { throw std::runtime_error("a callback that throws"); });
    w.on_complete([&](std::exception_ptr) {
      {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(2);
      }
      next.set_value(c.allreduce(y.data(), y.data(), y.size(), DataType::f32, ReduceOp::sum));
    });
    auto chained = next.get_future();
    ASSERT_EQ(chained.wait_for(30s), std::future_status::ready) << "the chaining callback never ran";
    chained.get().wait();
    EXPECT_EQ(y[0], 4.0f);
    w.wait();
    {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_EQ(order, (std::vector<int>{1, 2}));
    }
    bool ran = false;
    const auto me = std::this_thread::get_id();
    w.on_complete([&](std::exception_ptr e) {
      ran = std::this_thread::get_id() == me && e == nullptr;
    });
    EXPECT_TRUE(ran) << "a callback on a finished Work runs at once, on the caller's thread";
    bool empty_ran = false;
    Work().on_complete([&](std::exception_ptr) { empty_ran = true; });
    EXPECT_TRUE(empty_ran);
  });
}

// ---- a rank dies in the middle of an all-reduce -----------------------------------

// Four processes loop over large all-reduces; rank 2 kills itself (SIGKILL) while
// one is in flight. Every survivor must get a RemoteError naming rank 2 (or a
// Timeout) well within the deadline, and the time from the death to the error is
// printed (the "time from a rank's death to the error on the others").
TEST(Failures, KilledRankIsNamedOnEverySurvivor) {
  const std::string path = braid::test::temp_path("fault");
  const int n = 4, victim = 2;
  const auto deadline = 20s;
  const auto st = run_processes(n, [&](int r) {
    auto store = std::make_shared<FileStore>(path);
    CommOptions opt;
    opt.timeout = deadline;
    Communicator c(store, r, n, opt);
    std::vector<float> x(4 << 20, 1.f);  // 16 MiB: long enough to be killed mid-flight
    c.allreduce(x.data(), x.data(), x.size(), DataType::f32, ReduceOp::sum).wait();
    if (r == victim) {
      std::thread([&] {
        std::this_thread::sleep_for(20ms);
        const auto now = std::chrono::steady_clock::now().time_since_epoch();
        store->set("died_at", std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(now).count()));
        ::kill(::getpid(), SIGKILL);
      }).detach();
    }
    for (int it = 0; it < 1000; ++it) {
      try {
        c.allreduce(x.data(), x.data(), x.size(), DataType::f32, ReduceOp::sum).wait();
      } catch (const Error& e) {
        const auto now = std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::steady_clock::now().time_since_epoch()).count();
        const long long died = std::stoll(store->get("died_at", 5s));
        const std::string msg = e.what();
        std::fprintf(stderr, "[fault] rank %d: error %.1f ms after rank %d died: %s\n", r, (now - died) / 1000.0,
                     victim, msg.c_str());
        const auto* re = dynamic_cast<const RemoteError*>(&e);
        // A call posted after the communicator failed (a background tuner trial may be
        // the call that met the death) is refused at once with Aborted, carrying the
        // first failure; that failure must still name the dead rank.
        const bool refused = e.code() == ErrorCode::Aborted && msg.find("failed earlier") != std::string::npos;
        EXPECT_TRUE(re != nullptr || e.code() == ErrorCode::Timeout || refused) << msg;
        if (re) {
          EXPECT_EQ(re->peer(), victim) << msg;
        }
        EXPECT_NE(msg.find("rank " + std::to_string(victim)), std::string::npos) << msg;
        EXPECT_NE(msg.find("allreduce"), std::string::npos) << msg;
        EXPECT_LT(now - died, 5'000'000) << "error came too late";
        EXPECT_TRUE(c.failed());
        EXPECT_THROW(c.allreduce(x.data(), x.data(), 1, DataType::f32, ReduceOp::sum).wait(), Error);
        return;
      }
    }
    ADD_FAILURE() << "rank " << r << " never noticed the death of rank " << victim;
  }, std::chrono::seconds(60));
  for (int r = 0; r < n; ++r) {
    if (r == victim) {
      EXPECT_TRUE(WIFSIGNALED(st[static_cast<std::size_t>(r)]));
      continue;
    }
    EXPECT_TRUE(WIFEXITED(st[static_cast<std::size_t>(r)]) && WEXITSTATUS(st[static_cast<std::size_t>(r)]) == 0)
        << "survivor " << r << " failed or hung";
  }
  std::remove(path.c_str());
}

}  // namespace

namespace {

TEST(Failures, HugeTimeoutsMeanForever) {
  auto store = std::make_shared<TcpStore>("127.0.0.1", 0, true);
  CommOptions copt;
  copt.timeout = std::chrono::milliseconds::max();
  Communicator c(store, 0, 1, copt);
  float x = 2;
  AllreduceOptions o;
  o.timeout = std::chrono::milliseconds::max();
  Work w = c.allreduce(&x, &x, 1, DataType::f32, ReduceOp::sum, o);
  EXPECT_TRUE(w.wait(std::chrono::milliseconds::max()));
  EXPECT_EQ(x, 2.f);
  EXPECT_FALSE(c.failed());
}

// abort() from another thread unblocks a destructor that is draining a collective
// whose peer never comes.
TEST(Failures, AbortUnblocksADrainingDestructor) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  const auto port = server->port();
  std::atomic<bool> done{false};
  run_threads(2, [&](int r) {
    auto c = std::make_unique<Communicator>(std::make_shared<TcpStore>("127.0.0.1", port), r, 2);
    if (r == 1) {
      while (!done) std::this_thread::sleep_for(5ms);
      return;
    }
    float x = 1;
    c->allreduce(&x, &x, 1, DataType::f32, ReduceOp::sum);
    Communicator* raw = c.get();
    std::thread killer([raw] {
      std::this_thread::sleep_for(200ms);
      raw->abort();
    });
    const auto t0 = std::chrono::steady_clock::now();
    c.reset();  // drains: blocks until the abort
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
    killer.join();
    done = true;
  });
}

// Rank 2 never joins. Rank 1 gives up after 500 ms and closes its connections; rank
// 0, which still has to send to rank 1 but has nothing posted on that connection,
// must notice at once rather than wait for its own 20 s deadline.
TEST(Failures, NeighbourFailureIsNoticedWithoutPendingRequests) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  const auto port = server->port();
  std::atomic<int> finished{0};
  run_threads(3, [&](int r) {
    Communicator c(std::make_shared<TcpStore>("127.0.0.1", port), r, 3);
    if (r == 2) {
      while (finished < 2) std::this_thread::sleep_for(5ms);
      return;
    }
    std::vector<float> x(3000, 1.f);
    AllreduceOptions o;
    o.timeout = r == 1 ? 500ms : 20s;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c.allreduce(x.data(), x.data(), x.size(), DataType::f32, ReduceOp::sum, o).wait();
      ADD_FAILURE() << "rank " << r << " completed without rank 2";
    } catch (const Error& e) {
      if (r == 0) {
        EXPECT_EQ(e.code(), ErrorCode::RemoteError) << e.what();
        EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
        EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s) << e.what();
      } else {
        EXPECT_EQ(e.code(), ErrorCode::Timeout) << e.what();
      }
    }
    ++finished;
  });
}

}  // namespace
