// The device path under what makes real GPUs hang (issue 33; docs/gpu.md "Hazards"), on the
// emulated runtime, which models them (src/gpu/emulated.cpp):
// * one hardware queue per device (BRAID_EMU_HW_QUEUES=1, as CUDA_DEVICE_MAX_CONNECTIONS=1
//   that Megatron and NeMo set): a stream wait holds up every stream of the process;
// * a thread that allocates and frees device memory in a loop: a free waits for every
//   stream of the device while holding up the process's other runtime calls;
// * budgets: no host callback, no host synchronisation inside a call, and at most two
//   runtime calls of the progress thread per network transfer.
// Ranks are processes spawned afresh (test::run_spawned), each with the knobs in its
// environment before its runtime starts, so that every rank has its own device runtime.
// The old host-driven direct path (BRAID_DEVICE_PATH=direct) deadlocks in the first test
// (its engine enqueues device work behind the caller's stream's host-satisfied wait).
#include "test_support.hpp"

#include "collectives/plan.hpp"
#include "core/config.hpp"
#include "core/device_flow.hpp"
#include "gpu/runtime.hpp"

#include <braid/braid.hpp>
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

using namespace braid;
using namespace std::chrono_literals;

namespace {

gpu::Runtime& rt() { return core::gpu_runtime(); }

/// The knobs of a test's ranks: set in the parent (the spawned children inherit them and
/// run the test body again up to run_spawned) before anything reads the configuration.
/// The emulated runtime unless the environment chose CUDA (scripts/gpu_check.sh): there
/// the queues are the GPU's, CUDA_DEVICE_MAX_CONNECTIONS, read when a process first uses
/// CUDA, which the spawned ranks have not.
void emulate(int queues) {
  const char* backend = std::getenv("BRAID_GPU_BACKEND");
  if (backend != nullptr && std::string(backend) == "cuda") {
    ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", std::to_string(queues).c_str(), 1);
    return;
  }
  ::setenv("BRAID_GPU_BACKEND", "emulated", 1);
  ::setenv("BRAID_EMU_HW_QUEUES", std::to_string(queues).c_str(), 1);
}

struct DeviceBuffer {
  explicit DeviceBuffer(std::size_t n) : p(static_cast<float*>(rt().alloc_device(n * 4, 0))), count(n) {}
  ~DeviceBuffer() { rt().free_device(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void set(const std::vector<float>& v) { rt().copy(p, v.data(), v.size() * 4); }
  std::vector<float> get() const {
    std::vector<float> v(count);
    rt().copy(v.data(), p, count * 4);
    return v;
  }
  float* p;
  std::size_t count;
};

/// Every collective once on device buffers of `count` floats, each checked against the
/// value every rank can compute; the stream is the rank's own. Returns how many network
/// transfers (plan steps that are sends or receives) the calls had on this rank.
long run_every_collective(Communicator& c, gpu::Stream s, std::size_t count) {
  const int r = c.rank(), n = c.size();
  const auto value = [](int rank, std::size_t i) { return static_cast<float>((rank + 1) * 3 + static_cast<int>(i % 7)); };
  const auto sum_at = [&](std::size_t i) {
    float t = 0;
    for (int k = 0; k < n; ++k) t += value(k, i);
    return t;
  };
  long transfers = 0;
  const auto count_plan = [&](collectives::Collective what, Algorithm a, std::size_t per_call) {
    collectives::PlanRequest req(what, n, per_call, 4, ReduceOp::sum);
    req.rank = r;
    req.algorithm = a;
    req.slice_bytes = core::Config::global().chunk_bytes;
    if (a == Algorithm::automatic) return;
    const auto plan = collectives::build_plan(req);  // held: the loop reads its steps
    for (const auto& st : plan->steps)
      if (!collectives::is_local(st.kind)) ++transfers;
  };
  std::vector<float> mine(count);
  for (std::size_t i = 0; i < count; ++i) mine[i] = value(r, i);
  for (Algorithm a : {Algorithm::ring, Algorithm::tree, Algorithm::rhd}) {
    DeviceBuffer buf(count);
    buf.set(mine);
    AllreduceOptions o;
    o.stream = s;
    o.algorithm = a;
    c.allreduce(buf.p, buf.p, count, DataType::f32, ReduceOp::sum, o);  // no wait: the stream orders the copy
    rt().synchronize(s);
    const auto got = buf.get();
    for (std::size_t i = 0; i < count; i += 97) EXPECT_EQ(got[i], sum_at(i)) << to_string(a) << " at " << i;
    count_plan(collectives::Collective::allreduce, a, count);
  }
  {
    DeviceBuffer buf(count);
    buf.set(r == 1 % n ? mine : std::vector<float>(count, -1.f));
    BroadcastOptions o;
    o.stream = s;
    o.root = 1 % n;
    c.broadcast(buf.p, buf.p, count, DataType::f32, o);
    rt().synchronize(s);
    const auto got = buf.get();
    for (std::size_t i = 0; i < count; i += 97) EXPECT_EQ(got[i], value(1 % n, i)) << "broadcast at " << i;
  }
  {
    DeviceBuffer in(count), out(count * static_cast<std::size_t>(n));
    in.set(mine);
    AllgatherOptions o;
    o.stream = s;
    c.allgather(in.p, out.p, count, DataType::f32, o);
    rt().synchronize(s);
    const auto got = out.get();
    for (int k = 0; k < n; ++k)
      for (std::size_t i = 0; i < count; i += 131)
        EXPECT_EQ(got[static_cast<std::size_t>(k) * count + i], value(k, i)) << "allgather block " << k;
    count_plan(collectives::Collective::allgather, Algorithm::ring, count);
  }
  {
    DeviceBuffer in(count * static_cast<std::size_t>(n)), out(count);
    std::vector<float> all(count * static_cast<std::size_t>(n));
    for (int k = 0; k < n; ++k)
      for (std::size_t i = 0; i < count; ++i) all[static_cast<std::size_t>(k) * count + i] = value(r, i) + static_cast<float>(k);
    in.set(all);
    ReduceScatterOptions o;
    o.stream = s;
    c.reduce_scatter(in.p, out.p, count, DataType::f32, ReduceOp::sum, o);
    rt().synchronize(s);
    const auto got = out.get();
    for (std::size_t i = 0; i < count; i += 97)
      EXPECT_EQ(got[i], sum_at(i) + static_cast<float>(n * r)) << "reduce_scatter at " << i;
    count_plan(collectives::Collective::reduce_scatter, Algorithm::ring, count);
  }
  {
    // Compressed with error feedback: the codec runs on the device, residuals in device memory.
    DeviceBuffer buf(count);
    std::vector<float> ones(count, 1.f);
    buf.set(ones);
    AllreduceOptions o;
    o.stream = s;
    o.codec = "int8";
    o.ef_key = "hazards";
    const std::uint64_t launches = gpu::counts().launch;
    c.allreduce(buf.p, buf.p, count, DataType::f32, ReduceOp::sum, o);
    rt().synchronize(s);
    // One launch per codec step (issue 33 item 5), not one per ~8 Ki-value frame: n
    // encodes, the owner's n decodes and one encode over its whole shard (one piece here),
    // n decodes of the reduced payloads: 3n + 1 (10 on 3 ranks; frame by frame, 26).
    if (count / static_cast<std::size_t>(n) <= 65536) {
      EXPECT_LE(gpu::counts().launch - launches, 3u * static_cast<unsigned>(n) + 1)
          << "launches of a one-piece int8 all-reduce";
    }
    const auto got = buf.get();
    for (std::size_t i = 0; i < count; i += 97) EXPECT_NEAR(got[i], static_cast<float>(n), 0.05f * n) << "int8 at " << i;
  }
  return transfers;
}

}  // namespace

/// Every collective on 3 process ranks whose device has `queues` hardware queues, with an
/// allocation loop beside them, within the budgets.
static void every_collective_within_budgets(int queues) {
  emulate(queues);
  const std::string path = test::shared_value("HAZARD_PATH", test::temp_path("hazard1"));
  const int n = 3;
  const auto st = test::run_spawned(n, [&](int r) {
    auto store = std::make_shared<FileStore>(path);
    CommOptions opt;
    opt.timeout = 30s;
    Communicator c(store, r, n, opt);
    ASSERT_EQ(rt().hw_queues(), queues);
    const gpu::Stream s = rt().create_stream();
    // A thread of the application that allocates and frees device memory all along (a
    // caching allocator's retry, empty_cache): each free waits for every stream of the
    // device and holds up this process's other runtime calls meanwhile.
    std::atomic<bool> stop{false};
    std::atomic<long> frees{0};
    std::thread churn([&] {
      while (!stop.load()) {
        void* p = rt().alloc_device(1 << 16, 0);
        rt().free_device(p);
        frees.fetch_add(1);
        std::this_thread::sleep_for(200us);
      }
    });
    const gpu::Counts before = gpu::counts();
    const long transfers = run_every_collective(c, s, 100000);
    const gpu::Counts after = gpu::counts();
    stop = true;
    churn.join();
    EXPECT_GT(frees.load(), 0);
    EXPECT_GT(transfers, 0);
    // Budgets (issue 33: at most 2 per network transfer): the progress thread makes no
    // runtime call at all (a landed message is a host store), and no host callback runs.
    EXPECT_EQ(after.progress_api - before.progress_api, 0u)
        << "progress-thread runtime calls for " << transfers << " transfers";
    EXPECT_EQ(after.hostfn - before.hostfn, 0u) << "host callbacks";
    EXPECT_GT(core::DeviceFlow::programs(), 0) << "the device path did not run";
    rt().destroy_stream(s);
  }, std::chrono::seconds(240));
  for (int r = 0; r < n; ++r) EXPECT_TRUE(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0) << "rank " << r;
}

TEST(DeviceHazards, EveryCollectiveWithOneHardwareQueueAndAFreeLoop) { every_collective_within_budgets(1); }
TEST(DeviceHazards, EveryCollectiveWithEightHardwareQueuesAndAFreeLoop) { every_collective_within_budgets(8); }

TEST(DeviceHazards, NoHostWaitInsideACall) {
  // The call returns with its whole program enqueued, the caller's thread never having
  // waited for a stream: with the stream held by a wait that only the test releases, the
  // call still returns, and the result comes once the stream is let go.
  emulate(8);
  const std::string path = test::shared_value("HAZARD_PATH2", test::temp_path("hazard2"));
  const int n = 2;
  const auto st = test::run_spawned(n, [&](int r) {
    auto store = std::make_shared<FileStore>(path);
    CommOptions opt;
    opt.timeout = 30s;
    Communicator c(store, r, n, opt);
    const gpu::Stream s = rt().create_stream();
    auto* gate = static_cast<std::uint32_t*>(rt().alloc_pinned(4));
    *gate = 0;
    DeviceBuffer buf(4096);
    buf.set(std::vector<float>(4096, static_cast<float>(r + 1)));
    rt().wait_value(s, gate, 1);  // the application's own work, not done yet
    AllreduceOptions o;
    o.stream = s;
    const gpu::Counts before = gpu::counts();
    Work w = c.allreduce(buf.p, buf.p, 4096, DataType::f32, ReduceOp::sum, o);
    const gpu::Counts after = gpu::counts();
    EXPECT_EQ(after.sync - before.sync, 0u) << "host synchronisations inside the call";
    EXPECT_EQ(after.hostfn - before.hostfn, 0u) << "host callbacks enqueued by the call";
    std::this_thread::sleep_for(50ms);
    EXPECT_FALSE(w.test()) << "the all-reduce ran before the work ahead of it on the stream";
    rt().signal(gate, 1);
    w.wait();
    rt().synchronize(s);
    const auto got = buf.get();
    EXPECT_EQ(got[0], 3.f);
    EXPECT_EQ(got[4095], 3.f);
    rt().free_pinned(gate);
    rt().destroy_stream(s);
  }, std::chrono::seconds(120));
  for (int r = 0; r < n; ++r) EXPECT_TRUE(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0) << "rank " << r;
}

TEST(DeviceHazards, BraidsOwnCallsLeaveAnotherThreadsGlobalCaptureIntact) {
  // Issue 34 item 5: an application capturing a CUDA graph in global mode forbids every
  // thread in global mode from allocating, freeing or synchronising; such a call fails
  // and invalidates the capture. braid makes its own such calls (pinned blocks, device
  // scratch, error-feedback residuals, the kernels' load) in relaxed mode, as NCCL does,
  // so a capture under way while a communicator is made and runs device calls survives.
  emulate(8);
  if (std::getenv("BRAID_GPU_BACKEND") != nullptr && std::string(std::getenv("BRAID_GPU_BACKEND")) == "cuda")
    GTEST_SKIP() << "global-mode capture is driven through the emulation's hooks";
  const std::string path = test::shared_value("HAZARD_PATH5", test::temp_path("hazard5"));
  const int n = 2;
  const auto st = test::run_spawned(n, [&](int r) {
    gpu::EmulationHooks* hooks = gpu::emulation_hooks(rt());
    ASSERT_NE(hooks, nullptr);
    DeviceBuffer buf(50000);  // the test's own allocation, before the capture
    buf.set(std::vector<float>(50000, static_cast<float>(r + 1)));
    const gpu::Stream s = rt().create_stream(), graph = rt().create_stream();
    hooks->begin_global_capture(graph);  // the application's capture, on another stream
    {
      auto store = std::make_shared<FileStore>(path);
      CommOptions opt;
      opt.timeout = 30s;
      Communicator c(store, r, n, opt);
      AllreduceOptions o;
      o.stream = s;
      c.allreduce(buf.p, buf.p, 50000, DataType::f32, ReduceOp::sum, o).wait();
      o.codec = "int8";
      o.ef_key = "bucket";  // residuals in device memory, made at this call
      c.allreduce(buf.p, buf.p, 50000, DataType::f32, ReduceOp::sum, o).wait();
    }  // the communicator's frees, still within the capture
    EXPECT_NO_THROW(hooks->end_global_capture(graph)) << "braid's calls invalidated the application's capture";
    rt().synchronize(s);
    const auto got = buf.get();
    EXPECT_NEAR(got[0], 6.f, 0.1f);
    EXPECT_NEAR(got[49999], 6.f, 0.1f);
    rt().destroy_stream(s);
    rt().destroy_stream(graph);
  }, std::chrono::seconds(120));
  for (int r = 0; r < n; ++r) EXPECT_TRUE(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0) << "rank " << r;
}

TEST(DeviceHazards, AKilledRankReleasesEverySurvivorsStreamWithOneQueue) {
  emulate(1);
  const std::string path = test::shared_value("HAZARD_PATH3", test::temp_path("hazard3"));
  const int n = 3, victim = 2;
  const auto st = test::run_spawned(n, [&](int r) {
    auto store = std::make_shared<FileStore>(path);
    CommOptions opt;
    opt.timeout = 5s;
    Communicator c(store, r, n, opt);
    const gpu::Stream s = rt().create_stream();
    const std::size_t count = 1 << 18;
    DeviceBuffer buf(count);
    buf.set(std::vector<float>(count, 1.f));
    AllreduceOptions o;
    o.stream = s;
    c.allreduce(buf.p, buf.p, count, DataType::f32, ReduceOp::sum, o).wait();
    if (r == victim) {
      std::this_thread::sleep_for(100ms);
      ::kill(::getpid(), SIGKILL);
    }
    // Several calls queued on the stream behind the one that fails: every one of their
    // waits must be released, or the stream (and, with one queue, the device) stays stuck.
    std::vector<Work> w;
    for (int k = 0; k < 3; ++k) w.push_back(c.allreduce(buf.p, buf.p, count, DataType::f32, ReduceOp::sum, o));
    const auto t0 = std::chrono::steady_clock::now();
    rt().synchronize(s);  // returns once the stream is released
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
    for (auto& x : w) {
      try {
        x.wait();
        ADD_FAILURE() << "rank " << r << ": an all-reduce with a dead peer succeeded";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(victim)), std::string::npos) << e.what();
      }
    }
    EXPECT_TRUE(c.failed());
    rt().destroy_stream(s);
  }, std::chrono::seconds(120));
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    EXPECT_TRUE(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0) << "rank " << r;
  }
}

TEST(DeviceHazards, ThreadRanksThatWouldShareAQueueAreRefusedAtTheirFirstCall) {
  // Two ranks of one process on one device with one queue: rank 0's stream waiting for
  // rank 1's message would hold up rank 1's program. Refused, naming the remedy.
  emulate(1);
  const auto st = test::run_spawned(1, [&](int) {
    test::Group g(2);
    std::vector<std::string> errors(2);
    test::run_threads(2, [&](int r) {
      const gpu::Stream s = rt().create_stream();
      DeviceBuffer buf(1024);
      AllreduceOptions o;
      o.stream = s;
      try {
        g[r].allreduce(buf.p, buf.p, 1024, DataType::f32, ReduceOp::sum, o).wait();
      } catch (const Error& e) {
        errors[static_cast<std::size_t>(r)] = std::string(to_string(e.code())) + ": " + e.what();
      }
      rt().synchronize(s);
      rt().destroy_stream(s);
    });
    for (const auto& e : errors) {
      EXPECT_NE(e.find("InvalidUsage"), std::string::npos) << e;
      EXPECT_NE(e.find("CUDA_DEVICE_MAX_CONNECTIONS=4"), std::string::npos) << e;
      EXPECT_NE(e.find("one process per GPU"), std::string::npos) << e;
    }
  }, std::chrono::seconds(60));
  EXPECT_TRUE(WIFEXITED(st[0]) && WEXITSTATUS(st[0]) == 0);
}

TEST(DeviceHazards, PointToPointAfterCollectivesOnOneStream) {
  // A send (staged: point-to-point operations run beside each other) and a receive (a
  // program of its own) on the stream that the collectives before them used.
  emulate(32);
  const auto st = test::run_spawned(1, [&](int) {
    const int n = 3;
    CommOptions co;
    co.chunk_bytes = 8192;  // several messages per call
    test::Group g(n, co);
    test::run_threads(n, [&](int r) {
      const gpu::Stream s = rt().create_stream();
      const std::size_t count = 3001;
      DeviceBuffer a(count), b(count);
      for (int round = 0; round < 3; ++round) {
        a.set(std::vector<float>(count, static_cast<float>(r + 10 * round)));
        AllreduceOptions ao;
        ao.stream = s;
        g[r].allreduce(a.p, a.p, count, DataType::f32, ReduceOp::sum, ao);
        P2POptions o;
        o.stream = s;
        o.tag = 7;
        Work ws = g[r].send(a.p, count, DataType::f32, (r + 1) % n, o);
        Work wr = g[r].recv(b.p, count, DataType::f32, (r + n - 1) % n, o);
        rt().synchronize(s);
        ws.wait();
        wr.wait();
        const auto got = b.get();
        const float want = static_cast<float>(0 + 1 + 2 + 30 * round);
        EXPECT_EQ(got[0], want) << "rank " << r << " round " << round;
        EXPECT_EQ(got[count - 1], want) << "rank " << r << " round " << round;
      }
      rt().destroy_stream(s);
    });
  }, std::chrono::seconds(60));
  EXPECT_TRUE(WIFEXITED(st[0]) && WEXITSTATUS(st[0]) == 0);
}
