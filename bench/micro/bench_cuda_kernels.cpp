// GPU throughput of the CUDA kernels (src/kernels/cuda) at 256 MiB of f32 (64 Mi values,
// 256 MiB per operand for reductions), next to the device-to-device cudaMemcpy bandwidth
// measured in the same process.
//
// Counters per benchmark (time = CUDA events around the launches, manual time):
//   GBps       uncompressed bytes per second: 256 MiB / time (docs/codecs.md convention:
//              compare with copy_GBps, the cudaMemcpy of the same 256 MiB)
//   traffic    bytes read + written by the kernel per second (HBM traffic)
//   frac_copy  traffic / (2 x copy bandwidth): the fraction of the copy's memory throughput
//              (a cudaMemcpy of B bytes moves 2B); issue 6 asks >= 0.85 for encode, decode
//              and sum, >= 0.75 for the fused step.
// Without a GPU (or driver) it prints why and exits 0.
//
//   build/bench/bench_cuda_kernels --benchmark_min_time=0.5s
//   (add --benchmark_repetitions=3 --benchmark_report_aggregates_only=true for medians)
#include <braid/config.hpp>

#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>

#if BRAID_HAVE_CUDA

#include "compression/codec.hpp"
#include "kernels/cuda/cuda_kernels.hpp"

#include <cuda_runtime.h>

#include <functional>
#include <vector>

namespace {

namespace cu = braid::kernels::cuda;
namespace hk = braid::kernels;
namespace comp = braid::compression;

constexpr std::size_t kBytes = std::size_t{256} << 20;
constexpr std::size_t kN = kBytes / 4;

double g_copy_Bps = 0;  // bytes copied per second

#define CK(x)                                                                                   \
  do {                                                                                          \
    const cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_));                      \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

struct Buffers {
  float *x = nullptr, *y = nullptr, *res = nullptr, *acc = nullptr;
  std::uint8_t *pay_in = nullptr, *pay_out = nullptr;
  void* ws = nullptr;
  std::size_t ws_bytes = 0;
  int* status = nullptr;
  cudaStream_t s = nullptr;
  cudaEvent_t t0 = nullptr, t1 = nullptr;
};
Buffers g;

void fill_random(float* d, std::size_t n, unsigned seed) {
  std::vector<float> h(n);
  unsigned v = seed;
  for (auto& f : h) {
    v = v * 1664525u + 1013904223u;
    f = (static_cast<float>(v >> 8) / 16777216.0f - 0.5f) * 0.02f;
  }
  CK(cudaMemcpy(d, h.data(), 4 * n, cudaMemcpyHostToDevice));
}

// Times `launch` (one enqueue) with events; `moved` = bytes read + written.
void run(benchmark::State& st, std::size_t moved, const std::function<cu::Status()>& launch) {
  if (const cu::Status e = launch(); e != 0) {
    st.SkipWithError(cu::status_string(e).c_str());
    return;
  }
  CK(cudaStreamSynchronize(g.s));
  for (auto _ : st) {
    CK(cudaEventRecord(g.t0, g.s));
    if (const cu::Status e = launch(); e != 0) {  // a timed launch that failed times nothing
      st.SkipWithError(cu::status_string(e).c_str());
      return;
    }
    CK(cudaEventRecord(g.t1, g.s));
    CK(cudaEventSynchronize(g.t1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, g.t0, g.t1));
    st.SetIterationTime(ms / 1e3);
  }
  const auto per_s = benchmark::Counter::kIsIterationInvariantRate;
  st.counters["GBps"] = benchmark::Counter(static_cast<double>(kBytes) / 1e9, per_s);
  st.counters["traffic"] = benchmark::Counter(static_cast<double>(moved) / 1e9, per_s);
  st.counters["frac_copy"] = benchmark::Counter(static_cast<double>(moved) / (2 * g_copy_Bps), per_s);
  st.counters["copy_GBps"] = g_copy_Bps / 1e9;
}

void measure_copy() {
  const int reps = 20;
  CK(cudaMemcpyAsync(g.y, g.x, kBytes, cudaMemcpyDeviceToDevice, g.s));
  CK(cudaEventRecord(g.t0, g.s));
  for (int i = 0; i < reps; ++i) CK(cudaMemcpyAsync(g.y, g.x, kBytes, cudaMemcpyDeviceToDevice, g.s));
  CK(cudaEventRecord(g.t1, g.s));
  CK(cudaEventSynchronize(g.t1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, g.t0, g.t1));
  g_copy_Bps = static_cast<double>(kBytes) * reps / (ms / 1e3);
  std::printf("device-to-device cudaMemcpy of 256 MiB: %.1f GB/s (%.1f GB/s of traffic)\n", g_copy_Bps / 1e9,
              2 * g_copy_Bps / 1e9);
}

cu::DeviceCodec to_device(const comp::CodecSpec& s) {
  cu::DeviceCodec c;
  switch (s.kind) {
    case comp::CodecKind::none: c.kind = cu::DeviceCodec::Kind::raw; return c;
    case comp::CodecKind::fp16: c.kind = cu::DeviceCodec::Kind::fp16; return c;
    case comp::CodecKind::bf16: c.kind = cu::DeviceCodec::Kind::bf16; return c;
    case comp::CodecKind::int8: c.block.format = hk::BlockFormat::int8; break;
    case comp::CodecKind::int4: c.block.format = hk::BlockFormat::int4; break;
    case comp::CodecKind::fp8e4m3: c.block.format = hk::BlockFormat::fp8e4m3; break;
    case comp::CodecKind::fp8e5m2: c.block.format = hk::BlockFormat::fp8e5m2; break;
    default: c.block.format = hk::BlockFormat::sign1; break;
  }
  c.kind = cu::DeviceCodec::Kind::block;
  c.block.block = static_cast<std::uint32_t>(s.block);
  c.block.stochastic = s.rounding == comp::Rounding::stochastic;
  c.block.seed = s.seed;
  c.block.step = 1;
  return c;
}

void register_all() {
  using braid::DataType;
  using braid::ReduceOp;
  const std::pair<const char*, DataType> types[] = {{"f32", DataType::f32}, {"f64", DataType::f64},
                                                    {"f16", DataType::f16}, {"bf16", DataType::bf16},
                                                    {"i8", DataType::i8},   {"u8", DataType::u8},
                                                    {"i32", DataType::i32}, {"i64", DataType::i64}};
  const std::pair<const char*, ReduceOp> ops[] = {
      {"sum", ReduceOp::sum}, {"prod", ReduceOp::prod}, {"min", ReduceOp::min}, {"max", ReduceOp::max}};
  for (const auto& [tn, t] : types)
    for (const auto& [on, op] : ops) {
      if (t != DataType::f32 && op != ReduceOp::sum) continue;
      const std::size_t n = kBytes / braid::dtype_size(t);
      benchmark::RegisterBenchmark((std::string("reduce/") + tn + "/" + on).c_str(), [t = t, op = op, n](benchmark::State& st) {
        cu::ReduceArgs r;
        r.dtype = t;
        r.op = op;
        r.a = g.x;
        r.b = g.y;
        r.dst = g.acc;
        r.n = n;
        run(st, 3 * kBytes, [r] { return cu::reduce(r, g.s); });
      })->UseManualTime()->Unit(benchmark::kMillisecond);
    }

  for (const char* name : {"none", "fp16", "bf16", "fp8e4m3", "fp8e5m2", "int8", "int8:sr", "int4", "int4:sr",
                           "sign1"}) {
    const comp::CodecSpec spec = comp::parse_codec(name);
    const cu::DeviceCodec dc = to_device(spec);
    const std::size_t pb = comp::encoded_bytes(spec, kN);
    const std::string nm(name);
    benchmark::RegisterBenchmark(("encode/" + nm).c_str(), [=](benchmark::State& st) {
      cu::EncodeArgs a{dc, g.x, nullptr, kN, g.pay_out, nullptr};
      run(st, kBytes + pb, [a] { return cu::encode(a, g.s); });
    })->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("encode_ef/" + nm).c_str(), [=](benchmark::State& st) {
      cu::EncodeArgs a{dc, g.x, g.res, kN, g.pay_out, g.res};
      run(st, 3 * kBytes + pb, [a] { return cu::encode(a, g.s); });
    })->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("decode/" + nm).c_str(), [=](benchmark::State& st) {
      cu::EncodeArgs e{dc, g.x, nullptr, kN, g.pay_in, nullptr};
      CK(static_cast<cudaError_t>(cu::encode(e, g.s)));
      cu::DecodeArgs a{dc, g.pay_in, kN, g.acc, false};
      run(st, kBytes + pb, [a] { return cu::decode(a, g.s); });
    })->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("decode_acc/" + nm).c_str(), [=](benchmark::State& st) {
      cu::EncodeArgs e{dc, g.x, nullptr, kN, g.pay_in, nullptr};
      CK(static_cast<cudaError_t>(cu::encode(e, g.s)));
      cu::DecodeArgs a{dc, g.pay_in, kN, g.acc, true};
      run(st, 2 * kBytes + pb, [a] { return cu::decode(a, g.s); });
    })->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("fused/" + nm).c_str(), [=](benchmark::State& st) {
      cu::EncodeArgs e{dc, g.x, nullptr, kN, g.pay_in, nullptr};
      CK(static_cast<cudaError_t>(cu::encode(e, g.s)));
      cu::DecodeReduceEncodeArgs a{dc, g.pay_in, g.y, kN, nullptr, nullptr, g.pay_out};
      run(st, kBytes + 2 * pb, [a] { return cu::decode_reduce_encode(a, g.s); });
    })->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("fused_ef_acc/" + nm).c_str(), [=](benchmark::State& st) {
      cu::EncodeArgs e{dc, g.x, nullptr, kN, g.pay_in, nullptr};
      CK(static_cast<cudaError_t>(cu::encode(e, g.s)));
      cu::DecodeReduceEncodeArgs a{dc, g.pay_in, g.y, kN, g.acc, g.res, g.pay_out};
      run(st, 4 * kBytes + 2 * pb, [a] { return cu::decode_reduce_encode(a, g.s); });
    })->UseManualTime()->Unit(benchmark::kMillisecond);
  }

  const comp::CodecSpec tk = comp::parse_codec("topk:0.01");
  const std::size_t k = comp::topk_k(tk, kN);
  benchmark::RegisterBenchmark("encode/topk:0.01", [k](benchmark::State& st) {
    cu::TopkEncodeArgs a{g.x, nullptr, kN, k, g.pay_out, nullptr, g.ws, g.ws_bytes};
    run(st, kBytes + 8 * k, [a] { return cu::topk_encode(a, g.s); });
  })->UseManualTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("decode/topk:0.01", [k](benchmark::State& st) {
    cu::TopkEncodeArgs e{g.x, nullptr, kN, k, g.pay_in, nullptr, g.ws, g.ws_bytes};
    CK(static_cast<cudaError_t>(cu::topk_encode(e, g.s)));
    cu::TopkDecodeArgs a{g.pay_in, kN, k, g.acc, false, g.status};
    run(st, kBytes + 8 * k, [a] { return cu::topk_decode(a, g.s); });
  })->UseManualTime()->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  std::string reason;
  if (cu::device_count(&reason) == 0) {
    std::printf("bench_cuda_kernels: skipped, no CUDA device: %s\n", reason.c_str());
    return 0;
  }
  CK(cudaStreamCreate(&g.s));
  CK(cudaEventCreate(&g.t0));
  CK(cudaEventCreate(&g.t1));
  for (float** p : {&g.x, &g.y, &g.res, &g.acc}) CK(cudaMalloc(p, kBytes));
  CK(cudaMalloc(&g.pay_in, kBytes + 64));
  CK(cudaMalloc(&g.pay_out, kBytes + 64));
  CK(cudaMalloc(&g.status, sizeof(int)));
  fill_random(g.x, kN, 1);
  fill_random(g.y, kN, 2);
  CK(cudaMemset(g.res, 0, kBytes));
  CK(cudaMemset(g.acc, 0, kBytes));
  g.ws_bytes = cu::topk_workspace_bytes(kN, braid::compression::topk_k(braid::compression::parse_codec("topk:0.01"), kN));
  CK(cudaMalloc(&g.ws, g.ws_bytes ? g.ws_bytes : 1));
  cudaDeviceProp prop{};
  int dev = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaGetDeviceProperties(&prop, dev));
  std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  measure_copy();
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

#else  // !BRAID_HAVE_CUDA

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  std::printf("bench_cuda_kernels: skipped, braid was built without CUDA (BRAID_HAVE_CUDA=0)\n");
  return 0;
}

#endif
