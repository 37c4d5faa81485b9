// Microbenchmark of the host reduction kernel (src/kernels/host/reduce.cpp): sum for f32,
// f16, bf16, i32 and f8e4m3 at 64 KiB (cache), 1 MiB (L2/L3) and 64 MiB (DRAM) per buffer, next to
// memcpy of the same number of bytes.
//
// Two rates are reported, and they mean different things:
//   bytes_per_second ("GB/s" column): memory traffic the kernel asks for. For reduce that
//       is read a + read b + write dst = 3 x buffer bytes per call; for memcpy it is
//       read src + write dst = 2 x buffer bytes per call.
//   out_B/s (counter): bytes of output produced per second = buffer bytes per call, for
//       both. This is the column to compare reduce with memcpy: at DRAM sizes a reduce
//       that keeps up with memory shows out_B/s of about 2/3 of memcpy's.
//
// Run: bench_reduce [--benchmark_filter=sum/f16] [--benchmark_min_time=0.5]
#include "kernels/host/codec_kernels.hpp"
#include "kernels/host/reduce.hpp"

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

using braid::DataType;
using braid::ReduceOp;
namespace k = braid::kernels;

constexpr std::int64_t kSizes[] = {64 << 10, 1 << 20, 64 << 20};

// A buffer of `bytes` bytes holding the value 1 (or 0.5 for a) of type `dt`, so that
// sums stay finite and normal (no subnormal or NaN slow paths) however long it runs.
std::vector<std::uint64_t> filled(DataType dt, std::size_t bytes, bool half_value) {
  std::vector<std::uint64_t> storage((bytes + 7) / 8);
  auto* p = reinterpret_cast<unsigned char*>(storage.data());
  const std::size_t n = bytes / braid::dtype_size(dt);
  const float v = half_value ? 0.5f : 1.0f;
  for (std::size_t i = 0; i < n; ++i) {
    switch (dt) {
      case DataType::f32: reinterpret_cast<float*>(p)[i] = v; break;
      case DataType::f16: reinterpret_cast<std::uint16_t*>(p)[i] = k::float_to_half(v); break;
      case DataType::bf16: reinterpret_cast<std::uint16_t*>(p)[i] = k::float_to_bf16(v); break;
      case DataType::i32: reinterpret_cast<std::int32_t*>(p)[i] = half_value ? 3 : 1; break;
      case DataType::f8e4m3: p[i] = k::float_to_fp8(v, k::BlockFormat::fp8e4m3); break;
      default: break;
    }
  }
  return storage;
}

void set_rates(benchmark::State& state, std::int64_t bytes, int streams) {
  state.SetBytesProcessed(state.iterations() * bytes * streams);
  state.counters["out_B/s"] = benchmark::Counter(static_cast<double>(state.iterations() * bytes),
                                                 benchmark::Counter::kIsRate);
}

// dst = a + b, three separate buffers.
void BM_sum(benchmark::State& state, DataType dt, bool portable) {
  const auto bytes = state.range(0);
  const std::size_t n = static_cast<std::size_t>(bytes) / braid::dtype_size(dt);
  auto a = filled(dt, bytes, true);
  auto b = filled(dt, bytes, false);
  auto d = filled(dt, bytes, false);
  k::force_portable_path(portable);
  std::string label = portable ? "portable" : "best";
  if (dt == DataType::f16) label += std::string(" f16:") + k::half_path();
  state.SetLabel(label);
  for (auto _ : state) {
    k::reduce(dt, ReduceOp::sum, d.data(), a.data(), b.data(), n);
    benchmark::DoNotOptimize(d.data());
    benchmark::ClobberMemory();
  }
  k::force_portable_path(false);
  set_rates(state, bytes, 3);
}

// acc += b in place (dst == a), the engine's receive-and-reduce shape. acc grows by 1 per
// call and stays a normal float.
void BM_sum_inplace(benchmark::State& state, DataType dt) {
  const auto bytes = state.range(0);
  const std::size_t n = static_cast<std::size_t>(bytes) / braid::dtype_size(dt);
  auto acc = filled(dt, bytes, true);
  auto b = filled(dt, bytes, false);
  for (auto _ : state) {
    k::reduce(dt, ReduceOp::sum, acc.data(), acc.data(), b.data(), n);
    benchmark::DoNotOptimize(acc.data());
    benchmark::ClobberMemory();
  }
  set_rates(state, bytes, 3);
}

void BM_memcpy(benchmark::State& state) {
  const auto bytes = state.range(0);
  std::vector<std::uint64_t> src(static_cast<std::size_t>(bytes) / 8, 1), dst(static_cast<std::size_t>(bytes) / 8, 2);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), static_cast<std::size_t>(bytes));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_rates(state, bytes, 2);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("f16_path", k::half_path());
  benchmark::AddCustomContext("rates",
                              "bytes_per_second = read a + read b + write dst (memcpy: read + write); "
                              "out_B/s = output bytes per second (compare this with memcpy)");

  // Rates use CPU time (the library default), which is steadier than wall time on a
  // shared machine; pass --benchmark_... flags as usual to change repetitions.
  auto with_sizes = [](benchmark::internal::Benchmark* b) {
    for (auto s : kSizes) b->Arg(s);
  };
  with_sizes(benchmark::RegisterBenchmark("memcpy", BM_memcpy));
  // The CPU's best paths (AVX2 loops, F16C), then the portable ones (SSE2 loops, scalar
  // f16 conversions) as on a CPU without them.
  for (bool portable : {false, true}) {
    const std::string suffix = portable ? "_portable" : "";
    with_sizes(benchmark::RegisterBenchmark(("sum/f32" + suffix).c_str(), BM_sum, DataType::f32, portable));
    with_sizes(benchmark::RegisterBenchmark(("sum/f16" + suffix).c_str(), BM_sum, DataType::f16, portable));
    with_sizes(benchmark::RegisterBenchmark(("sum/bf16" + suffix).c_str(), BM_sum, DataType::bf16, portable));
    with_sizes(benchmark::RegisterBenchmark(("sum/i32" + suffix).c_str(), BM_sum, DataType::i32, portable));
    with_sizes(benchmark::RegisterBenchmark(("sum/f8e4m3" + suffix).c_str(), BM_sum, DataType::f8e4m3, portable));
  }
  with_sizes(benchmark::RegisterBenchmark("sum_inplace/f32", BM_sum_inplace, DataType::f32));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
