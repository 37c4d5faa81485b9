// Device buffers in every collective (docs/gpu.md), through the device runtime the process
// has: the host emulation (BRAID_GPU_BACKEND=emulated, set below unless the environment
// names another backend) on machines without a GPU, which is CI; the CUDA backend under
// scripts/gpu_check.sh (BRAID_GPU_BACKEND=cuda).
//
// What is checked:
// * every collective, every element type and op, in and out of place, every all-reduce
//   algorithm and the codecs (with and without error feedback), over every transport of
//   the build (test::grid): the device result equals the host path's result for the same
//   call bit for bit;
// * the stream contract: the call is ordered after the work already on its stream, and
//   work enqueued afterwards sees the result, with no host wait in between;
// * refusals before any byte moves: host and device buffers mixed, a buffer of another
//   device, memory = device on host memory, a stream under capture, a device that does
//   not exist;
// * failure: a rank killed while the others are in a device all-reduce fails every
//   survivor with RemoteError naming it, and releases their streams.
#include "test_support.hpp"

#include "core/config.hpp"
#include "core/device_exec.hpp"
#include "core/device_flow.hpp"
#include "gpu/runtime.hpp"
#include "kernels/host/reduce.hpp"

#include <braid/braid.hpp>
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

using namespace braid;
using namespace std::chrono_literals;
using braid::test::run_threads;

namespace {

// The emulated runtime unless the environment chose one (the GPU check runs this file
// with BRAID_GPU_BACKEND=cuda). Set before the configuration is first read.
const bool kBackendSet = [] {
  ::setenv("BRAID_GPU_BACKEND", "emulated", 0);
  // Up to 8 ranks of this process share the one GPU, each stream waiting on its own host
  // word. On an H100 the grid deadlocked from 5 ranks on (2 to 4 passed): a stream's wait
  // is thought to hold up the other streams CUDA maps onto the same hardware queue, so
  // one rank's staging never ran (docs/gpu.md, "Several ranks on one GPU"). As many queues
  // as CUDA allows, read when the context is made, so before any CUDA call. Unverified.
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  // The emulated runtime: a hardware queue per stream. Ranks here are threads of one
  // process on one device, which a GPU's queues cannot keep apart: besides the ranks' own
  // streams (two each, which the device path checks against the queues), the runtime's
  // private streams (a synchronous copy's) land in the same round-robin, and a rank's wait
  // there holds up another rank's copy. The queue hazards are tested with process ranks, as
  // jobs run (test_device_hazards, with 1 and 8 queues).
  ::setenv("BRAID_EMU_HW_QUEUES", "128", 0);
  return true;
}();

gpu::Runtime& rt() { return core::gpu_runtime(); }

using DevicePath = core::Config::DevicePath;
DevicePath path() { return core::Config::global().device_path; }
/// Bytes that device calls moved through pinned slots, on whichever path runs plans.
long long slot_bytes() { return core::DeviceFlow::slot_bytes(); }

bool skip_without_device() {
  return rt().device_count() == 0;
}

/// Device memory of the current device, freed on scope exit.
struct DeviceBuffer {
  explicit DeviceBuffer(std::size_t n) : bytes(n), p(rt().alloc_device(n, rt().current_device())) {}
  ~DeviceBuffer() { rt().free_device(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::byte* data() const { return static_cast<std::byte*>(p); }
  std::size_t bytes;
  void* p;
};

/// Page-locked host memory, freed on scope exit. Ranks that are threads of one process
/// copy to and from the host through it: a copy to pageable memory blocks its thread until
/// the stream gets there, and CUDA holds up the other threads' CUDA calls meanwhile (seen on
/// an H100), so a rank waiting that way for a collective would keep the other ranks from
/// issuing theirs: a deadlock. With pinned memory copy_async returns at once.
template <typename T>
struct PinnedHost {
  explicit PinnedHost(std::size_t count, T value = T{})
      : n(count), p(static_cast<T*>(rt().alloc_pinned(count * sizeof(T)))) {
    std::fill(p, p + n, value);
  }
  ~PinnedHost() { rt().free_pinned(p); }
  PinnedHost(const PinnedHost&) = delete;
  PinnedHost& operator=(const PinnedHost&) = delete;
  T* data() const { return p; }
  std::size_t size() const { return n; }
  T& operator[](std::size_t i) const { return p[i]; }
  std::size_t n;
  T* p;
};

/// A stream of the calling rank (ranks that are threads of one process need their own
/// streams, as with NCCL: the calls of two ranks on one stream wait on each other).
struct OwnStream {
  OwnStream() : s(rt().create_stream()) {}
  ~OwnStream() { rt().destroy_stream(s); }
  OwnStream(const OwnStream&) = delete;
  OwnStream& operator=(const OwnStream&) = delete;
  gpu::Stream s;
};

enum class Kind {
  allreduce,
  broadcast,
  reduce,
  allgather,
  reduce_scatter,
  alltoall,
  gather,
  scatter,
  sendrecv,
  allgatherv,
  reduce_scatter_v,
  alltoallv
};

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::allreduce: return "allreduce";
    case Kind::broadcast: return "broadcast";
    case Kind::reduce: return "reduce";
    case Kind::allgather: return "allgather";
    case Kind::reduce_scatter: return "reduce_scatter";
    case Kind::alltoall: return "alltoall";
    case Kind::gather: return "gather";
    case Kind::scatter: return "scatter";
    case Kind::sendrecv: return "sendrecv";
    case Kind::allgatherv: return "allgatherv";
    case Kind::reduce_scatter_v: return "reduce_scatter_v";
    case Kind::alltoallv: return "alltoallv";
  }
  return "?";
}

// The v-collectives' block sizes for a case of `count`: rank j's block, and what rank
// `from` sends rank `to` (symmetric for an in-place case).
std::vector<std::size_t> v_blocks(std::size_t count, int world) {
  std::vector<std::size_t> v(static_cast<std::size_t>(world));
  for (std::size_t j = 0; j < v.size(); ++j) v[j] = (count * (j + 1)) % (count + 5);
  return v;
}
std::size_t v_pair(std::size_t count, bool in_place, int from, int to) {
  const auto f = static_cast<std::size_t>(from), t = static_cast<std::size_t>(to);
  return (count + (in_place ? f + t : 3 * f + t)) % (count + 4);
}
std::vector<std::size_t> v_line(std::size_t count, bool in_place, int rank, int world, bool sent) {
  std::vector<std::size_t> v(static_cast<std::size_t>(world));
  for (int j = 0; j < world; ++j) v[static_cast<std::size_t>(j)] = sent ? v_pair(count, in_place, rank, j) : v_pair(count, in_place, j, rank);
  return v;
}
std::size_t sum_of(const std::vector<std::size_t>& v, std::size_t upto) {
  std::size_t s = 0;
  for (std::size_t j = 0; j < upto; ++j) s += v[j];
  return s;
}

struct Case {
  Kind kind = Kind::allreduce;
  DataType dtype = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  std::size_t count = 0;
  bool in_place = false;
  int root = 0;
  Algorithm algo = Algorithm::ring;
  std::string codec;  ///< all-reduce only
  std::string ef;     ///< error-feedback key prefix (host and device keep separate residuals)
};

std::string describe(const Case& c) {
  std::string s = std::string(kind_name(c.kind)) + " " + std::string(to_string(c.dtype)) + " " +
                  std::string(to_string(c.op)) + " n=" + std::to_string(c.count) + (c.in_place ? " in place" : "") +
                  " root " + std::to_string(c.root) + " " + std::string(to_string(c.algo));
  if (!c.codec.empty()) s += " codec " + c.codec + (c.ef.empty() ? "" : " ef");
  return s;
}

// Elements of the input and output buffers (per rank), and where they start inside one
// allocation of `span` elements (in place: overlapping as the API's conventions say).
struct Layout {
  std::size_t in = 0, out = 0, span = 0, in_at = 0, out_at = 0;
};
Layout layout(const Case& c, int rank, int world) {
  const std::size_t n = c.count, w = static_cast<std::size_t>(world), r = static_cast<std::size_t>(rank);
  Layout l;
  switch (c.kind) {
    case Kind::allreduce: case Kind::broadcast: case Kind::reduce: case Kind::sendrecv: l.in = l.out = n; break;
    case Kind::allgather: case Kind::gather: l.in = n; l.out = n * w; break;
    case Kind::reduce_scatter: case Kind::scatter: l.in = n * w; l.out = n; break;
    case Kind::alltoall: l.in = l.out = n * w; break;
    case Kind::allgatherv: {
      const auto b = v_blocks(n, world);
      l.in = b[r], l.out = sum_of(b, w);
      break;
    }
    case Kind::reduce_scatter_v: {
      const auto b = v_blocks(n, world);
      l.in = sum_of(b, w), l.out = b[r];
      break;
    }
    case Kind::alltoallv:
      l.in = sum_of(v_line(n, c.in_place, rank, world, true), w);
      l.out = sum_of(v_line(n, c.in_place, rank, world, false), w);
      break;
  }
  if (!c.in_place) {
    l.in_at = 0;
    l.out_at = l.in;
    l.span = l.in + l.out;
  } else if (c.kind == Kind::allgather || c.kind == Kind::gather || c.kind == Kind::allgatherv) {
    l.span = l.out;
    l.out_at = 0;
    l.in_at = c.kind == Kind::allgatherv ? sum_of(v_blocks(n, world), r) : r * n;
  } else if (c.kind == Kind::reduce_scatter || c.kind == Kind::scatter || c.kind == Kind::reduce_scatter_v) {
    l.span = l.in;
    l.in_at = 0;
    l.out_at = c.kind == Kind::reduce_scatter_v ? sum_of(v_blocks(n, world), r) : r * n;
  } else {
    l.span = l.in;
  }
  return l;
}

void fill(DataType t, std::byte* p, std::size_t n, int rank, std::size_t salt) {
  for (std::size_t i = 0; i < n; ++i) {
    const int v = static_cast<int>((static_cast<std::size_t>(rank) * 7 + i * 3 + salt) % 11) - 5;
    switch (t) {
      case DataType::f32: { const float f = static_cast<float>(v) * 0.75f; std::memcpy(p + 4 * i, &f, 4); break; }
      case DataType::f64: { const double d = v * 0.3; std::memcpy(p + 8 * i, &d, 8); break; }
      case DataType::f16: { const auto h = kernels::float_to_half(static_cast<float>(v) * 0.3f); std::memcpy(p + 2 * i, &h, 2); break; }
      case DataType::bf16: { const auto h = kernels::float_to_bf16(static_cast<float>(v) * 0.3f); std::memcpy(p + 2 * i, &h, 2); break; }
      case DataType::i8: case DataType::u8: { p[i] = static_cast<std::byte>(v); break; }
      case DataType::i32: { const std::int32_t x = v; std::memcpy(p + 4 * i, &x, 4); break; }
      case DataType::i64: { const std::int64_t x = v * 1000003LL; std::memcpy(p + 8 * i, &x, 8); break; }
      case DataType::f8e4m3:
      case DataType::f8e5m2: {
        const auto f = t == DataType::f8e4m3 ? kernels::BlockFormat::fp8e4m3 : kernels::BlockFormat::fp8e5m2;
        p[i] = static_cast<std::byte>(kernels::float_to_fp8(static_cast<float>(v) * 0.375f, f));
        break;
      }
    }
  }
}

/// Issues the case's call on `c` with buffers `in`/`out` (which may be host or device).
/// Send/recv: to the next rank, from the previous one.
std::vector<Work> issue(Communicator& c, const Case& k, const void* in, void* out, gpu::Stream stream,
                        const std::string& ef_side) {
  const int rank = c.rank(), world = c.size();
  std::vector<Work> w;
  auto set = [&](CollectiveOptions& o) { o.stream = stream; };
  const double scale = is_floating(k.dtype) ? 0.375 : 3.0;  // premul_sum's factor (other ops ignore it)
  switch (k.kind) {
    case Kind::allreduce: {
      AllreduceOptions o;
      set(o);
      o.algorithm = k.algo;
      o.codec = k.codec;
      if (!k.ef.empty()) o.ef_key = k.ef + ef_side;
      o.scale = scale;
      w.push_back(c.allreduce(in, out, k.count, k.dtype, k.op, o));
      break;
    }
    case Kind::broadcast: {
      BroadcastOptions o;
      set(o);
      o.root = k.root;
      w.push_back(c.broadcast(in, out, k.count, k.dtype, o));
      break;
    }
    case Kind::reduce: {
      ReduceOptions o;
      set(o);
      o.root = k.root;
      o.scale = scale;
      w.push_back(c.reduce(in, out, k.count, k.dtype, k.op, o));
      break;
    }
    case Kind::allgather: {
      AllgatherOptions o;
      set(o);
      w.push_back(c.allgather(in, out, k.count, k.dtype, o));
      break;
    }
    case Kind::reduce_scatter: {
      ReduceScatterOptions o;
      set(o);
      o.scale = scale;
      w.push_back(c.reduce_scatter(in, out, k.count, k.dtype, k.op, o));
      break;
    }
    case Kind::alltoall: {
      AlltoallOptions o;
      set(o);
      w.push_back(c.alltoall(in, out, k.count, k.dtype, o));
      break;
    }
    case Kind::gather: {
      GatherOptions o;
      set(o);
      o.root = k.root;
      w.push_back(c.gather(in, out, k.count, k.dtype, o));
      break;
    }
    case Kind::scatter: {
      ScatterOptions o;
      set(o);
      o.root = k.root;
      w.push_back(c.scatter(in, out, k.count, k.dtype, o));
      break;
    }
    case Kind::allgatherv: {
      AllgatherOptions o;
      set(o);
      w.push_back(c.allgatherv(in, out, v_blocks(k.count, world), k.dtype, o));
      break;
    }
    case Kind::reduce_scatter_v: {
      ReduceScatterOptions o;
      set(o);
      o.scale = scale;
      w.push_back(c.reduce_scatter_v(in, out, v_blocks(k.count, world), k.dtype, k.op, o));
      break;
    }
    case Kind::alltoallv: {
      AlltoallOptions o;
      set(o);
      w.push_back(c.alltoallv(in, v_line(k.count, k.in_place, rank, world, true), out,
                              v_line(k.count, k.in_place, rank, world, false), k.dtype, o));
      break;
    }
    case Kind::sendrecv: {
      P2POptions o;
      set(o);
      o.tag = 7;
      // Send first: on one stream a recv holds back every later call (docs/gpu.md).
      w.push_back(c.send(in, k.count, k.dtype, (rank + 1) % world, o));
      w.push_back(c.recv(out, k.count, k.dtype, (rank + world - 1) % world, o));
      break;
    }
  }
  return w;
}

/// Runs the case on host buffers and on device buffers on this rank, and checks the device
/// result equals the host result bit for bit (read back on the stream, before waiting).
/// One rank's device buffer and pinned host copies, made once for all its cases: cudaFree
/// synchronizes the whole device, so a rank freeing a buffer between cases would wait on
/// another rank's stream, which waits for this rank's next call (a deadlock; the same holds
/// for NCCL kernels). The largest case decides the size.
struct RankBuffers {
  explicit RankBuffers(std::size_t bytes) : dev(bytes), init(bytes), back(bytes) {}
  DeviceBuffer dev;
  PinnedHost<std::byte> init, back;
};

void check_case(Communicator& c, const Case& k, gpu::Stream stream, RankBuffers& rb) {
  const int rank = c.rank(), world = c.size();
  const std::size_t es = dtype_size(k.dtype);
  const Layout l = layout(k, rank, world);
  const bool writes_out = !((k.kind == Kind::reduce || k.kind == Kind::gather) && rank != k.root);
  std::vector<std::byte> host(l.span * es + 1), init(l.span * es + 1);
  fill(k.dtype, init.data(), l.span, rank, k.count);
  host = init;
  for (auto& w : issue(c, k, host.data() + l.in_at * es, host.data() + l.out_at * es, nullptr, "host")) w.wait();

  const std::size_t bytes = l.span * es + 1;
  ASSERT_LE(bytes, rb.dev.bytes) << describe(k);
  std::byte* const dev = rb.dev.data();
  std::byte* const back = rb.back.data();
  std::memcpy(rb.init.data(), init.data(), bytes);
  rt().copy_async(dev, rb.init.data(), bytes, stream);
  auto works = issue(c, k, dev + l.in_at * es, dev + l.out_at * es, stream, "device");
  rt().copy_async(back, dev, bytes, stream);  // stream order, no host wait
  rt().synchronize(stream);
  for (auto& w : works) w.wait();
  if (writes_out) {
    ASSERT_EQ(0, std::memcmp(back + l.out_at * es, host.data() + l.out_at * es, l.out * es))
        << describe(k) << " on rank " << rank << "/" << world;
  } else {
    ASSERT_EQ(0, std::memcmp(back, init.data(), bytes)) << describe(k) << ": a non-root's buffer changed";
  }
}

std::vector<Case> cases(int world) {
  std::vector<Case> out;
  const DataType all_types[] = {DataType::f32, DataType::f64, DataType::f16,    DataType::bf16,  DataType::i8,
                                DataType::u8,  DataType::i32, DataType::i64,    DataType::f8e4m3, DataType::f8e5m2};
  const ReduceOp all_ops[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg,
                              ReduceOp::premul_sum};
  for (DataType t : all_types)
    for (ReduceOp op : all_ops)
      for (bool ip : {false, true}) out.push_back({Kind::allreduce, t, op, 1037, ip});
  for (Algorithm a : {Algorithm::tree, Algorithm::rhd, Algorithm::hierarchical, Algorithm::automatic})
    out.push_back({Kind::allreduce, DataType::f32, ReduceOp::sum, 5000, false, 0, a});
  for (std::size_t n : {std::size_t{1}, std::size_t{40000}})
    for (bool ip : {false, true}) {
      out.push_back({Kind::broadcast, DataType::i32, ReduceOp::sum, n, ip, world - 1});
      out.push_back({Kind::reduce, DataType::f32, ReduceOp::sum, n, ip, 1 % world});
      out.push_back({Kind::allgather, DataType::bf16, ReduceOp::sum, n, ip});
      out.push_back({Kind::reduce_scatter, DataType::f64, ReduceOp::max, n, ip});
      // f32 with values whose sums are exact in any order: the host path's reduce may be
      // measured into another algorithm than the device path's.
      out.push_back({Kind::reduce, DataType::f32, ReduceOp::premul_sum, n, ip, world - 1});
      out.push_back({Kind::allgatherv, DataType::i32, ReduceOp::sum, n + 3, ip});
      out.push_back({Kind::reduce_scatter_v, DataType::f32, ReduceOp::premul_sum, n + 3, ip});
      out.push_back({Kind::alltoallv, DataType::u8, ReduceOp::sum, n + 3, ip});
      out.push_back({Kind::reduce_scatter, DataType::f32, ReduceOp::premul_sum, n, ip});
      out.push_back({Kind::alltoall, DataType::u8, ReduceOp::sum, n, ip});
      out.push_back({Kind::gather, DataType::i64, ReduceOp::sum, n, ip, world / 2});
      out.push_back({Kind::scatter, DataType::f16, ReduceOp::sum, n, ip, world - 1});
      out.push_back({Kind::allgather, DataType::f8e4m3, ReduceOp::sum, n, ip});
      out.push_back({Kind::broadcast, DataType::f8e5m2, ReduceOp::sum, n, ip, 0});
      out.push_back({Kind::reduce_scatter, DataType::f8e5m2, ReduceOp::sum, n, ip});
    }
  out.push_back({Kind::sendrecv, DataType::i64, ReduceOp::sum, 3001, false});
  // Compressed all-reduce (f32 sum/avg), with error feedback where the codec needs it:
  // run twice, so that the second call adds the residuals the first one left.
  for (int rep = 0; rep < 2; ++rep) {
    out.push_back({Kind::allreduce, DataType::f32, ReduceOp::sum, 20000, false, 0, Algorithm::automatic, "fp16"});
    out.push_back({Kind::allreduce, DataType::f32, ReduceOp::avg, 20000, true, 0, Algorithm::automatic, "int8"});
    out.push_back({Kind::allreduce, DataType::f32, ReduceOp::sum, 20000, false, 0, Algorithm::automatic, "sign1", "ef-s"});
    out.push_back({Kind::allreduce, DataType::f32, ReduceOp::sum, 20000, true, 0, Algorithm::automatic, "topk:0.05", "ef-t"});
    // Stochastic rounding: its RNG is keyed by the rank's stream seed, the step and each
    // value's global index, all of which the device's encode steps must pass as the host's do.
    out.push_back({Kind::allreduce, DataType::f32, ReduceOp::avg, 20000, false, 0, Algorithm::automatic, "int4:sr:seed=3", "ef-i"});
  }
  return out;
}

class DeviceCollectives : public test::GridTest {};

TEST_P(DeviceCollectives, EveryCollectiveMatchesTheHostPathBitForBit) {
  if (skip_without_device()) GTEST_SKIP() << "no device runtime: " << rt().describe();
  CommOptions o;
  o.timeout = 30s;
  o.chunk_bytes = 8192;
  test::Group g(world(), o, hosts(), transport());
  const auto all = cases(world());
  run_threads(world(), [&](int r) {
    OwnStream s;
    std::size_t most = 0;
    for (const Case& k : all) most = std::max(most, layout(k, r, world()).span * dtype_size(k.dtype) + 1);
    RankBuffers rb(most);
    for (const Case& k : all) {
      if (k.algo == Algorithm::hierarchical && hosts() == 0) continue;  // needs several hosts
      check_case(g[r], k, s.s, rb);
      if (::testing::Test::HasFatalFailure()) return;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, DeviceCollectives,
                         ::testing::ValuesIn(test::grid({2, 3, 5, 8}, {{"shm", {1, 2, 3, 4, 5, 8}}, {"ucx", {2, 3}}})),
                         test::grid_name);

TEST(DeviceStream, TheCallIsOrderedAfterEarlierWorkAndLaterWorkSeesTheResult) {
  if (skip_without_device()) GTEST_SKIP() << "no device runtime: " << rt().describe();
  const int n = 3;
  const std::size_t count = 100000;
  test::Group g(n);
  run_threads(n, [&](int r) {
    OwnStream s;
    DeviceBuffer buf(count * 4);
    std::vector<float> zeros(count, 0.f);
    PinnedHost<float> ones(count, static_cast<float>(r + 1)), back(count, -1.f);
    rt().copy(buf.data(), zeros.data(), count * 4);
    // Earlier work on the stream: a slow host step, then the input is written. If the
    // collective did not wait for it, it would reduce the zeros.
    rt().launch_host(s.s, [](void*) { std::this_thread::sleep_for(200ms); }, nullptr);
    rt().copy_async(buf.data(), ones.data(), count * 4, s.s);
    AllreduceOptions o;
    o.stream = s.s;
    Work w = g[r].allreduce(buf.data(), buf.data(), count, DataType::f32, ReduceOp::sum, o);
    // Later work: read the result back on the stream, without waiting on the host.
    rt().copy_async(back.data(), buf.data(), count * 4, s.s);
    rt().synchronize(s.s);
    // Staged, the stream waits for the host to finish the call; the device path never makes
    // a stream wait for the host, and its Work completes once the progress thread has seen
    // the program's end, a moment after the stream passed it.
    if (path() != DevicePath::stream) {
      EXPECT_TRUE(w.test()) << "the stream went on before the Work completed";
    }
    w.wait();
    for (std::size_t i = 0; i < count; i += 997) ASSERT_EQ(back[i], 6.f) << "element " << i << " on rank " << r;
  });
}

/// An in-place ring all-reduce (sum) of `count` floats on device memory, each rank adding
/// rank + 1, on a stream of its own; checks the result on the host.
void ring_sum_of_ranks(Communicator& c, int r, int n, std::size_t count) {
  OwnStream s;
  DeviceBuffer buf(count * 4);
  PinnedHost<float> in(count, static_cast<float>(r + 1)), back(count, -1.f);
  rt().copy_async(buf.data(), in.data(), count * 4, s.s);
  AllreduceOptions o;
  o.stream = s.s;
  o.algorithm = Algorithm::ring;
  c.allreduce(buf.data(), buf.data(), count, DataType::f32, ReduceOp::sum, o).wait();
  rt().copy_async(back.data(), buf.data(), count * 4, s.s);
  rt().synchronize(s.s);
  const float want = static_cast<float>(n * (n + 1) / 2);
  for (std::size_t i = 0; i < count; i += 101) ASSERT_EQ(back[i], want) << "element " << i << " on rank " << r;
}

// The path BRAID_DEVICE_PATH names is the one that runs the call: stream (the default)
// enqueues a program per call (core::DeviceFlow, whose stream is a DeviceExec's); staged
// makes neither. (CI runs this file with stream and staged.)
TEST(DevicePath, TheConfiguredPathRunsTheCall) {
  if (skip_without_device()) GTEST_SKIP() << "no device runtime: " << rt().describe();
  const int n = 2;
  const std::size_t count = 4096;
  test::Group g(n);
  const int before = core::DeviceExec::made();
  const long programs = core::DeviceFlow::programs();
  run_threads(n, [&](int r) { ring_sum_of_ranks(g[r], r, n, count); });
  EXPECT_EQ(core::DeviceExec::made() - before, path() == DevicePath::staged ? 0 : n);
  if (path() == DevicePath::stream)
    EXPECT_GE(core::DeviceFlow::programs() - programs, n) << "BRAID_DEVICE_PATH=stream, but no program was enqueued";
  else
    EXPECT_EQ(core::DeviceFlow::programs() - programs, 0) << "a program was enqueued on another path";
}

// Compressed all-reduce on the device path encodes on the GPU before anything leaves it:
// the bytes that cross into pinned slots over tcp (a transport that takes host memory)
// are the compressed ones. int8 is about a quarter of f32 (one byte a value plus an f32
// scale a block of 256).
TEST(DevicePath, CompressedCallsEncodeOnTheGpuSoOnlyCompressedBytesLeaveIt) {
  if (skip_without_device()) GTEST_SKIP() << "no device runtime: " << rt().describe();
  if (path() == DevicePath::staged)
    GTEST_SKIP() << "BRAID_DEVICE_PATH=staged (compressed calls are staged there): test_device_collectives runs this";
  const std::size_t count = 1 << 16;
  test::Group g(2, {}, 0, "tcp");
  const auto run = [&](const std::string& codec) {
    const long long bytes = slot_bytes();
    const long steps = core::DeviceExec::codec_steps();
    run_threads(2, [&](int r) {
      OwnStream s;
      DeviceBuffer buf(count * 4);
      PinnedHost<float> in(count, static_cast<float>(r + 1)), back(count, -1.f);
      rt().copy_async(buf.data(), in.data(), count * 4, s.s);
      AllreduceOptions o;
      o.stream = s.s;
      o.codec = codec;
      g[r].allreduce(buf.data(), buf.data(), count, DataType::f32, ReduceOp::sum, o).wait();
      rt().copy_async(back.data(), buf.data(), count * 4, s.s);
      rt().synchronize(s.s);
      for (std::size_t i = 0; i < count; i += 97) ASSERT_NEAR(back[i], 3.0f, 0.05f) << codec << ", element " << i;
    });
    return std::make_pair(slot_bytes() - bytes, core::DeviceExec::codec_steps() - steps);
  };
  const auto raw = run("none");
  const auto int8 = run("int8");
  EXPECT_EQ(raw.second, 0) << "an uncompressed call ran codec steps";
  EXPECT_GT(int8.second, 0) << "the compressed call ran no codec step on the device";
  EXPECT_GT(raw.first, 0);
  EXPECT_LT(int8.first * 3, raw.first) << "int8 moved " << int8.first << " bytes through pinned slots, f32 " << raw.first
                                       << ": the values left the GPU before they were encoded";
}

// bf16 device buffers with a codec: staged (the stream path stages them by itself, as the
// staged path does) they are widened once the stream has staged the input, compressed in
// f32 and rounded back, so the result has the bits of the same call on host buffers.
TEST(DevicePath, HalfBuffersWithACodecAreStaged) {
  if (skip_without_device()) GTEST_SKIP() << "no device runtime: " << rt().describe();
  const std::size_t count = 3001;
  test::Group g(2);
  run_threads(2, [&](int r) {
    OwnStream s;
    DeviceBuffer buf(count * 2);
    PinnedHost<std::uint16_t> in(count, 0), back(count, 0);
    for (std::size_t i = 0; i < count; ++i)
      in[i] = kernels::float_to_bf16(std::sin(0.1f * static_cast<float>(i) + static_cast<float>(r)));
    rt().copy_async(buf.data(), in.data(), count * 2, s.s);
    AllreduceOptions o;
    o.stream = s.s;
    o.codec = "int8";
    g[r].allreduce(buf.data(), buf.data(), count, DataType::bf16, ReduceOp::sum, o).wait();
    rt().copy_async(back.data(), buf.data(), count * 2, s.s);
    rt().synchronize(s.s);
    std::vector<std::uint16_t> host(in.data(), in.data() + count);
    AllreduceOptions ho;
    ho.codec = "int8";
    g[r].allreduce(host.data(), host.data(), count, DataType::bf16, ReduceOp::sum, ho).wait();
    EXPECT_EQ(std::vector<std::uint16_t>(back.data(), back.data() + count), host);
  });
}

// fp8 device buffers with a codec (the codecs take f32/f16/bf16 only) are refused with
// InvalidUsage when the call is made, on either device path, and nothing is written.
TEST(DevicePath, Fp8BuffersWithACodecAreRefusedBeforeAnyByteMoves) {
  if (skip_without_device()) GTEST_SKIP() << "no device runtime: " << rt().describe();
  const std::size_t count = 1001;
  test::Group g(2);
  run_threads(2, [&](int r) {
    OwnStream s;
    DeviceBuffer buf(count);
    PinnedHost<std::uint8_t> in(count, 0x38), back(count, 0);
    rt().copy_async(buf.data(), in.data(), count, s.s);
    for (DataType t : {DataType::f8e4m3, DataType::f8e5m2}) {
      AllreduceOptions o;
      o.stream = s.s;
      o.codec = "int8";
      try {
        g[r].allreduce(buf.data(), buf.data(), count, t, ReduceOp::sum, o);
        ADD_FAILURE() << to_string(t) << " with a codec was accepted";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::InvalidUsage) << e.what();
        EXPECT_NE(std::string(e.what()).find("f32, bf16 or f16"), std::string::npos) << e.what();
      }
    }
    // codec=auto picks none for fp8: the sum is the plain one.
    AllreduceOptions o;
    o.stream = s.s;
    o.codec = "auto";
    g[r].allreduce(buf.data(), buf.data(), count, DataType::f8e4m3, ReduceOp::sum, o).wait();
    rt().copy_async(back.data(), buf.data(), count, s.s);
    rt().synchronize(s.s);
    for (std::size_t i = 0; i < count; i += 97) ASSERT_EQ(back[i], 0x40) << i;  // 1 + 1 = 2
  });
}

// Error feedback on the device path keeps its residuals in GPU memory. The same calls
// under a device key and a host key leave the same residuals (their checkpoints are the
// same bytes); a checkpoint restored brings the device residuals back; a key keeps to
// one memory kind until it is reset.
TEST(DevicePath, ErrorFeedbackResidualsLiveOnTheGpuAndCheckpointAsHostOnes) {
  if (skip_without_device()) GTEST_SKIP() << "no device runtime: " << rt().describe();
  if (path() == DevicePath::staged)
    GTEST_SKIP() << "BRAID_DEVICE_PATH=staged (residuals stay on the host there): test_device_collectives runs this";
  const std::size_t count = 5000;
  test::Group g(2);
  std::atomic<int> restore_ready{0}, restored{0};
  run_threads(2, [&](int r) {
    Communicator& c = g[r];
    OwnStream s;
    DeviceBuffer buf(count * 4);
    PinnedHost<float> in(count), back(count);
    const auto fill_in = [&](int step) {
      for (std::size_t i = 0; i < count; ++i) in[i] = std::sin(0.37f * static_cast<float>(i) + static_cast<float>(r + 3 * step));
    };
    const auto options = [](const std::string& key) {
      AllreduceOptions o;
      o.codec = "sign1";
      o.ef_key = key;
      return o;
    };
    const auto on_device = [&](int step, const std::string& key) {
      fill_in(step);
      rt().copy_async(buf.data(), in.data(), count * 4, s.s);
      AllreduceOptions o = options(key);
      o.stream = s.s;
      c.allreduce(buf.data(), buf.data(), count, DataType::f32, ReduceOp::sum, o).wait();
      rt().copy_async(back.data(), buf.data(), count * 4, s.s);
      rt().synchronize(s.s);
      return std::vector<float>(back.data(), back.data() + count);
    };
    const auto on_host = [&](int step, const std::string& key) {
      fill_in(step);
      std::vector<float> h(in.data(), in.data() + count);
      c.allreduce(h.data(), h.data(), count, DataType::f32, ReduceOp::sum, options(key)).wait();
      return h;
    };
    for (int step = 0; step < 2; ++step)
      ASSERT_EQ(on_device(step, "d/bucket"), on_host(step, "h/bucket")) << "step " << step << " on rank " << r;
    std::ostringstream dev_ckpt, host_ckpt;
    c.save_error_feedback(dev_ckpt, "d/");
    c.save_error_feedback(host_ckpt, "h/");
    EXPECT_EQ(dev_ckpt.str(), host_ckpt.str()) << "the residuals left in GPU memory differ from the host path's";
    // Both keys' worker residuals (count values each) at least: the GPU's are counted too.
    EXPECT_GE(c.error_feedback_bytes(), 2 * count * sizeof(float));
    const auto third = on_device(2, "d/bucket");
    // Restoring frees the key's GPU residuals, and a free waits for every stream of the
    // device: the other rank (a thread of this process, on the same device) must not be in
    // its next call already, whose program waits for this rank's (as with NCCL kernels).
    restore_ready.fetch_add(1);
    while (restore_ready.load() < 2) std::this_thread::sleep_for(1ms);
    std::istringstream restore(dev_ckpt.str());
    c.restore_error_feedback(restore, "d/");
    restored.fetch_add(1);  // nor start it before the other rank has freed
    while (restored.load() < 2) std::this_thread::sleep_for(1ms);
    EXPECT_EQ(on_device(2, "d/bucket"), third) << "the restored checkpoint did not bring the GPU residuals back";
    try {
      on_host(3, "d/bucket");
      ADD_FAILURE() << "a host call under a key whose residuals are in GPU memory was not refused";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidUsage) << e.what();
      EXPECT_NE(std::string(e.what()).find("GPU memory"), std::string::npos) << e.what();
    }
    c.reset_error_feedback("d/bucket");
    EXPECT_NO_THROW(on_host(3, "d/bucket")) << "after a reset, the key may change memory kind";
  });
}

TEST(DeviceStream, ManyCallsInFlightOnOneStreamRunInIssueOrder) {
  if (skip_without_device()) GTEST_SKIP() << "no device runtime: " << rt().describe();
  const int n = 2, calls = 20;
  test::Group g(n);
  run_threads(n, [&](int r) {
    OwnStream s;
    DeviceBuffer buf(4 * 1024);
    std::vector<std::int32_t> init(1024, 1);
    PinnedHost<std::int32_t> back(1024, 0);
    rt().copy(buf.data(), init.data(), init.size() * 4);
    std::vector<Work> works;
    AllreduceOptions o;
    o.stream = s.s;
    // Each in-place sum doubles the values: the result is 2^calls only in issue order
    // with every call seeing the one before it.
    for (int i = 0; i < calls; ++i)
      works.push_back(g[r].allreduce(buf.data(), buf.data(), 1024, DataType::i32, ReduceOp::sum, o));
    rt().copy_async(back.data(), buf.data(), back.size() * 4, s.s);
    rt().synchronize(s.s);
    for (auto& w : works) w.wait();
    for (std::size_t i = 0; i < back.size(); ++i) ASSERT_EQ(back[i], 1 << calls) << "element " << i << " on rank " << r;
  });
}

// Each call in flight holds a pinned block for its transfers; BRAID_DEVICE_PINNED_BYTES
// bounds what they hold together: a call past it waits, on the calling thread, for earlier
// ones (counted as a host wait), and one call alone may exceed it. 20 calls of 1 MiB on a
// stream, issued back to back, with a 1 MiB limit: each call needs about 2 MiB of slots,
// so at most one is in flight per rank, and the results are the same.
TEST(DeviceStream, PinnedMemoryOfCallsInFlightStaysWithinTheLimit) {
  if (skip_without_device()) GTEST_SKIP() << "no device runtime: " << rt().describe();
  if (rt().emulation() == nullptr) GTEST_SKIP() << "the emulated runtime counts pinned bytes; this is " << rt().describe();
  if (path() == DevicePath::staged)
    GTEST_SKIP() << "BRAID_DEVICE_PATH=staged (whole buffers staged, no per-call blocks): test_device_collectives runs this";
  // Fresh processes, whose configuration is read with the limit set (a process reads it once).
  ::setenv("BRAID_DEVICE_PINNED_BYTES", "1M", 1);
  const std::string path = test::shared_value("DEVPIN_PATH", braid::test::temp_path("devpin"));
  const int n = 2, calls = 20;
  const std::size_t count = 256 * 1024;
  const auto st = test::run_spawned(n, [&](int r) {
    gpu::EmulationHooks* emu = rt().emulation();
    auto store = std::make_shared<FileStore>(path);
    Communicator c(store, r, n);
    OwnStream s;
    DeviceBuffer buf(4 * count);
    std::vector<std::int32_t> init(count, 1);
    PinnedHost<std::int32_t> back(count, 0);
    rt().copy(buf.data(), init.data(), init.size() * 4);
    const std::size_t before = emu->pinned_bytes();
    emu->reset_pinned_peak();
    const std::uint64_t syncs = gpu::counts().sync;
    std::vector<Work> works;
    AllreduceOptions o;
    o.stream = s.s;
    for (int i = 0; i < calls; ++i) works.push_back(c.allreduce(buf.data(), buf.data(), count, DataType::i32, ReduceOp::sum, o));
    rt().copy_async(back.data(), buf.data(), back.size() * 4, s.s);
    rt().synchronize(s.s);
    for (auto& w : works) w.wait();
    for (std::size_t i = 0; i < back.size(); i += 101) ASSERT_EQ(back[i], 1 << calls) << "element " << i;
    // One call's block at a time: 2 MiB of slots and its words, rounded to 64 KiB.
    const std::size_t one_call = 2 * 4 * count + 64 * 1024;
    EXPECT_LE(emu->pinned_peak(), before + one_call) << "rank " << r << ": pinned bytes at most";
    EXPECT_GT(gpu::counts().sync, syncs) << "rank " << r << ": no call waited for pinned memory";
  });
  ::unsetenv("BRAID_DEVICE_PINNED_BYTES");
  for (int r = 0; r < n; ++r) EXPECT_TRUE(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0) << "rank " << r;
}

// A call that cannot get pinned memory within its timeout (the calls ahead of it are held
// up by their stream) fails with Timeout naming the limit, and fails the communicator so
// that its peers hear why; the stream is released.
TEST(DeviceStream, ACallThatWaitsPastItsTimeoutForPinnedMemoryFailsNamingTheLimit) {
  if (skip_without_device()) GTEST_SKIP() << "no device runtime: " << rt().describe();
  if (path() == DevicePath::staged)
    GTEST_SKIP() << "BRAID_DEVICE_PATH=staged (whole buffers staged, no per-call blocks): test_device_collectives runs this";
  ::setenv("BRAID_DEVICE_PINNED_BYTES", "1M", 1);
  const std::string path = test::shared_value("DEVPIN2_PATH", braid::test::temp_path("devpin2"));
  const int n = 2;
  const std::size_t count = 256 * 1024;
  const auto st = test::run_spawned(n, [&](int r) {
    auto store = std::make_shared<FileStore>(path);
    CommOptions opt;
    opt.timeout = 1000ms * braid::test::kTimeScale;
    Communicator c(store, r, n, opt);
    OwnStream s;
    DeviceBuffer buf(4 * count);
    auto* gate = static_cast<std::uint32_t*>(rt().alloc_pinned(4));
    *gate = 0;
    rt().wait_value(s.s, gate, 1);  // the application's own work ahead of the calls, not done
    AllreduceOptions o;
    o.stream = s.s;
    Work first = c.allreduce(buf.data(), buf.data(), count, DataType::i32, ReduceOp::sum, o);
    try {
      c.allreduce(buf.data(), buf.data(), count, DataType::i32, ReduceOp::sum, o);
      ADD_FAILURE() << "rank " << r << ": the second call got pinned memory past the limit";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::Timeout) << e.what();
      EXPECT_NE(std::string(e.what()).find("BRAID_DEVICE_PINNED_BYTES"), std::string::npos) << e.what();
    }
    // The engine takes the abort on its own thread.
    for (int i = 0; i < 200 && !c.failed(); ++i) std::this_thread::sleep_for(10ms);
    EXPECT_TRUE(c.failed());
    rt().signal(gate, 1);
    EXPECT_THROW(first.wait(), Error);
    rt().synchronize(s.s);  // released
    rt().free_pinned(gate);
  });
  ::unsetenv("BRAID_DEVICE_PINNED_BYTES");
  for (int r = 0; r < n; ++r) EXPECT_TRUE(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0) << "rank " << r;
}

TEST(DeviceStream, AStreamThatNeverReachesTheCallFailsItWithATimeoutThatSaysSo) {
  if (skip_without_device()) GTEST_SKIP() << "no device runtime: " << rt().describe();
  CommOptions co;
  co.timeout = 300ms;
  test::Group g(2, co);
  std::atomic<bool> release{false};
  run_threads(2, [&](int r) {
    OwnStream s;
    DeviceBuffer buf(4096);
    AllreduceOptions o;
    o.stream = s.s;
    // Rank 0's stream is held by earlier work that outlives the deadline (here a host
    // step; on a GPU, a kernel or an event wait).
    if (r == 0)
      rt().launch_host(
          s.s,
          [](void* flag) {
            while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::sleep_for(1ms);
          },
          &release);
    Work w = g[r].allreduce(buf.data(), buf.data(), 1024, DataType::f32, ReduceOp::sum, o);
    if (r == 0) {
      // The call fails while its stream is still held; its Work completes once the stream
      // has let go of the staging memory, so let the stream go on first.
      const auto give_up = std::chrono::steady_clock::now() + 10s;
      while (!g[0].failed() && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(5ms);
      release = true;
    }
    try {
      w.wait();
      ADD_FAILURE() << "rank " << r << ": the all-reduce succeeded without rank 0's input";
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (r == 0) {
        EXPECT_EQ(e.code(), ErrorCode::Timeout) << msg;
        EXPECT_NE(msg.find("stream has not reached it"), std::string::npos) << msg;
      } else if (path() == DevicePath::staged) {
        // Staged, rank 1's input is staged by a host function too, and the driver has one
        // callback thread, which rank 0's held stream keeps busy: rank 1's stream may not
        // reach its call either.
        EXPECT_TRUE(msg.find("rank 0") != std::string::npos || msg.find("stream has not reached it") != std::string::npos)
            << msg;
      } else {
        EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
      }
    }
    EXPECT_TRUE(g[r].failed());
    rt().synchronize(s.s);  // the stream drains: the failed call released it
  });
}

TEST(DeviceTopology, EachRanksGpuAndThePeerAccessOfThisProcessesGpusAreDescribed) {
  if (skip_without_device()) GTEST_SKIP() << "no device runtime: " << rt().describe();
  test::Group g(2);
  const std::string text = g[0].describe_topology();
  // Every rank's GPU as it published it: on CUDA its PCI bus id, emulated its backend.
  const std::string gpu = rt().pci_bus_id(0).empty() ? "GPU 0 (" + std::string(gpu::to_string(rt().backend())) + ")"
                                                      : "GPU 0, PCI " + rt().pci_bus_id(0);
  EXPECT_NE(text.find("rank 0 uses " + gpu), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1 uses " + gpu), std::string::npos) << text;
  if (rt().device_count() > 1) {
    EXPECT_NE(text.find("GPU peer access (this process's devices): 0<->1="), std::string::npos) << text;
  }
  // NVLink as NVML reports it: the host's GPUs on a machine with the NVIDIA driver (the GPU
  // check), else why NVML is unknown (CI: no driver). The rank's own GPU is among them.
  if (rt().backend() == gpu::Backend::cuda) {
    EXPECT_NE(text.find("GPU " + rt().pci_bus_id(0) + ": "), std::string::npos) << text;
  } else {
    EXPECT_NE(text.find("    NVLink: unknown (NVML: "), std::string::npos) << text;
  }
}

TEST(DeviceRefusals, BadBuffersAndStreamsAreRefusedBeforeAnyByteMoves) {
  if (skip_without_device()) GTEST_SKIP() << "no device runtime: " << rt().describe();
  test::Group g(1);
  Communicator& c = g[0];
  DeviceBuffer dev(4096);
  std::vector<float> host(1024, 1.f);
  auto expect = [](ErrorCode code, const std::function<void()>& fn, const std::vector<std::string>& words) {
    try {
      fn();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      for (const auto& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
    }
  };
  expect(ErrorCode::InvalidUsage,
         [&] { c.allreduce(dev.data(), host.data(), 1024, DataType::f32, ReduceOp::sum); },
         {"allreduce", "send buffer", "device memory", "recv buffer", "host memory"});
  AllreduceOptions want_device;
  want_device.memory = MemoryKind::device;
  expect(ErrorCode::InvalidUsage,
         [&] { c.allreduce(host.data(), host.data(), 1024, DataType::f32, ReduceOp::sum, want_device); },
         {"memory = device", "host memory"});
  if (rt().device_count() > 1) {
    void* other = rt().alloc_device(4096, 1);
    expect(ErrorCode::InvalidUsage,
           [&] { c.allreduce(other, other, 1024, DataType::f32, ReduceOp::sum); },
           {"memory of GPU 1", "uses GPU 0", "CommOptions::device"});
    rt().free_device(other);
  }
  OwnStream s;
  rt().begin_capture(s.s);
  AllreduceOptions captured;
  captured.stream = s.s;
  expect(ErrorCode::Unsupported, [&] { c.allreduce(dev.data(), dev.data(), 1024, DataType::f32, ReduceOp::sum, captured); },
         {"captured", "graph"});
  rt().end_capture(s.s);
  // Nothing moved: the communicator still works, on device buffers too.
  EXPECT_FALSE(c.failed());
  AllreduceOptions fine;
  fine.stream = s.s;
  c.allreduce(dev.data(), dev.data(), 1024, DataType::f32, ReduceOp::sum, fine).wait();
  CommOptions bad;
  bad.device = 7;
  auto store = std::make_shared<FileStore>(braid::test::temp_path("devbad"));
  expect(ErrorCode::InvalidUsage, [&] { Communicator x(store, 0, 1, bad); }, {"CommOptions::device 7", "does not exist"});
}

// A split keeps its parent's GPU (the resolved one, not the splitting thread's current
// device, which is GPU 0 here): the child takes GPU 1's buffers and refuses GPU 0's.
TEST(DeviceRefusals, ASplitKeepsItsParentsGpu) {
  if (skip_without_device()) GTEST_SKIP() << "no device runtime: " << rt().describe();
  if (rt().device_count() < 2) GTEST_SKIP() << "one GPU: nothing to tell apart";
  CommOptions o;
  o.device = 1;
  test::Group g(1, o);
  ASSERT_EQ(rt().current_device(), 0);
  Communicator child = g[0].split(0, 0);
  void* one = rt().alloc_device(4096, 1);
  void* zero = rt().alloc_device(4096, 0);
  OwnStream s;
  AllreduceOptions ao;
  ao.stream = s.s;
  EXPECT_NO_THROW(child.allreduce(one, one, 1024, DataType::f32, ReduceOp::sum, ao).wait());
  try {
    child.allreduce(zero, zero, 1024, DataType::f32, ReduceOp::sum, ao).wait();
    ADD_FAILURE() << "the child took GPU 0's buffers";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("uses GPU 1"), std::string::npos) << e.what();
  }
  rt().synchronize(s.s);
  rt().free_device(one);
  rt().free_device(zero);
}

TEST(DeviceFailures, AKilledRankFailsEverySurvivorAndReleasesTheirStreams) {
  if (skip_without_device()) GTEST_SKIP() << "no device runtime: " << rt().describe();
  // Fresh processes, not forks: this process has used the device runtime already, and
  // CUDA does not work in a child forked after that.
  const std::string path = test::shared_value("DEVFAULT_PATH", braid::test::temp_path("devfault"));
  const int n = 3, victim = 1;
  const auto st = test::run_spawned(n, [&](int r) {
    auto store = std::make_shared<FileStore>(path);
    CommOptions opt;
    opt.timeout = 20s;
    Communicator c(store, r, n, opt);
    OwnStream s;
    const std::size_t count = 1 << 20;
    DeviceBuffer buf(count * 4);
    std::vector<float> ones(count, 1.f), back(count, 0.f);
    rt().copy(buf.data(), ones.data(), count * 4);
    AllreduceOptions o;
    o.stream = s.s;
    c.allreduce(buf.data(), buf.data(), count, DataType::f32, ReduceOp::sum, o).wait();  // all three, once
    if (r == victim) {
      std::this_thread::sleep_for(100ms);
      ::kill(::getpid(), SIGKILL);
    }
    Work w = c.allreduce(buf.data(), buf.data(), count, DataType::f32, ReduceOp::sum, o);
    // Work after the call on the same stream: it must run (the stream is released).
    rt().copy_async(back.data(), buf.data(), 4, s.s);
    rt().synchronize(s.s);
    try {
      w.wait();
      ADD_FAILURE() << "rank " << r << ": the all-reduce with a dead peer succeeded";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_TRUE(e.code() == ErrorCode::RemoteError || e.code() == ErrorCode::Timeout) << msg;
      EXPECT_NE(msg.find("rank " + std::to_string(victim)), std::string::npos) << msg;
    }
    EXPECT_TRUE(c.failed());
  }, std::chrono::seconds(90));
  for (int r = 0; r < n; ++r) {
    if (r == victim) {
      EXPECT_TRUE(WIFSIGNALED(st[r])) << "the victim was not killed";
      continue;
    }
    EXPECT_TRUE(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0) << "survivor " << r << " status " << st[r];
  }
}

}  // namespace
