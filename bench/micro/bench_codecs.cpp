// Microbenchmark of the codec kernels (src/compression/codec.hpp, formats in docs/codecs.md):
// encode, decode and decode_accumulate per codec at 64 MiB of f32 input (DRAM-sized), on
// one core, next to memcpy of the same 64 MiB in the same process.
//
// Rate (the "GB/s" column, bytes_per_second): f32 bytes on the uncompressed side per
// second = 4 x count / time, for every codec and direction, and 64 MiB / time for memcpy.
// So "encode int8 at 50% of memcpy" means encoding 64 MiB of floats takes twice as long
// as copying them. The counter ratio_vs_memcpy (shown with a "/s" suffix by the
// library; it is a plain ratio) divides by the best of 10 memcpys timed on the thread's CPU
// clock at start-up; the memcpy/64MiB row is the same copy under the harness. Rates use CPU
// time, which is steadier than wall time on a shared machine.
//
// Run: bench_codecs [--benchmark_filter=int8] [--benchmark_min_time=0.5]
#include "compression/codec.hpp"
#include "kernels/host/codec_kernels.hpp"
#include "kernels/host/reduce.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <time.h>
#include <vector>

namespace {

namespace c = braid::compression;

constexpr std::size_t kBytes = 64u << 20;
constexpr std::size_t kCount = kBytes / sizeof(float);
double g_memcpy_rate = 0;

const std::vector<float>& input() {
  static const std::vector<float> x = [] {
    std::vector<float> v(kCount);
    std::mt19937 g(1);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& f : v) f = d(g);
    return v;
  }();
  return x;
}

void finish(benchmark::State& state) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(kBytes));
  if (g_memcpy_rate > 0) {
    const double rate = static_cast<double>(state.iterations()) * kBytes;
    state.counters["ratio_vs_memcpy"] =
        benchmark::Counter(rate / g_memcpy_rate, benchmark::Counter::kIsRate);
  }
}

void BM_memcpy(benchmark::State& state) {
  std::vector<float> dst(kCount, 2.0f);
  const auto& src = input();
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), kBytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(kBytes));
}

// memcpy rate (bytes per CPU second, like the harness's rates) for the ratio counter: best
// of 10 copies timed with the thread's CPU clock.
double measure_memcpy() {
  std::vector<float> dst(kCount, 2.0f);
  const auto& src = input();
  double best = 1e30;
  for (int i = 0; i < 10; ++i) {
    timespec t0{}, t1{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    std::memcpy(dst.data(), src.data(), kBytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    best = std::min(best, static_cast<double>(t1.tv_sec - t0.tv_sec) + 1e-9 * static_cast<double>(t1.tv_nsec - t0.tv_nsec));
  }
  return kBytes / best;
}

enum class Op { encode, encode_ef, decode, decode_accumulate };

void BM_codec(benchmark::State& state, std::string name, Op op, bool portable) {
  braid::kernels::force_portable_path(portable);
  const c::CodecSpec s = c::parse_codec(name);
  const auto& x = input();
  std::vector<std::uint8_t> payload(c::encoded_bytes(s, kCount));
  c::encode(s, x.data(), kCount, payload.data());
  std::vector<float> out(kCount, 0.0f);
  std::uint64_t step = 0;
  for (auto _ : state) {
    switch (op) {
      case Op::encode: c::encode(s, x.data(), kCount, payload.data(), step++, 0); break;
      case Op::encode_ef: c::encode_add_feedback(s, x.data(), out.data(), kCount, payload.data(), step++, 0); break;
      case Op::decode: c::decode(s, payload.data(), kCount, out.data()); break;
      case Op::decode_accumulate: c::decode_accumulate(s, payload.data(), kCount, out.data()); break;
    }
    benchmark::DoNotOptimize(payload.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
    if (op == Op::decode_accumulate || op == Op::encode_ef) {
      // keep out finite and bounded: accumulators / residuals restart every 64 calls
      if ((step++ & 63) == 63) std::fill(out.begin(), out.end(), 0.0f);
    }
  }
  state.SetLabel("payload " + std::to_string(payload.size() >> 10) + " KiB, " + braid::kernels::codec_path());
  braid::kernels::force_portable_path(false);
  finish(state);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("codec_path", braid::kernels::codec_path());
  benchmark::AddCustomContext("f16_path", braid::kernels::half_path());
  benchmark::AddCustomContext("rates", "GB/s = f32 input bytes (64 MiB) per CPU second; memcpy = 64 MiB copied");
  input();
  g_memcpy_rate = measure_memcpy();
  // ratio_vs_memcpy divides by a best-of-10 memcpy measured before the runs; the memcpy
  // row below is the same copy under the benchmark harness.
  benchmark::RegisterBenchmark("memcpy/64MiB", BM_memcpy)->Unit(benchmark::kMillisecond);
  const char* codecs[] = {"none", "fp16", "bf16", "fp8e4m3", "fp8e5m2", "int8", "int8:sr",
                          "int4", "int4:sr", "sign1", "mxfp8", "mxfp4", "topk:0.01"};
  for (const char* n : codecs) {
    for (auto [op, opname] : {std::pair{Op::encode, "encode"}, std::pair{Op::decode, "decode"},
                              std::pair{Op::decode_accumulate, "decode_accumulate"}}) {
      benchmark::RegisterBenchmark((std::string(opname) + "/" + n).c_str(), BM_codec, std::string(n), op, false)
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (const char* n : {"int8", "sign1", "topk:0.01"})
    benchmark::RegisterBenchmark((std::string("encode_ef/") + n).c_str(), BM_codec, std::string(n), Op::encode_ef, false)
        ->Unit(benchmark::kMillisecond);
  // The baseline (SSE2) loops, as on a CPU without AVX2/F16C.
  for (const char* n : {"fp16", "bf16", "int8", "sign1"})
    for (auto [op, opname] : {std::pair{Op::encode, "encode"}, std::pair{Op::decode, "decode"}})
      benchmark::RegisterBenchmark((std::string(opname) + "_portable/" + n).c_str(), BM_codec, std::string(n), op,
                                   true)
          ->Unit(benchmark::kMillisecond);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
