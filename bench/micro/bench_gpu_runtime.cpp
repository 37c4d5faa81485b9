// Microbenchmarks of the device runtime calls the device path is made of (docs/gpu.md,
// "Calibration"), through braid's own runtime interface (src/gpu/runtime.hpp), so that
// one program measures a GPU (BRAID_GPU_BACKEND=cuda) and the emulation that stands in
// for it in CI (BRAID_GPU_BACKEND=emulated): what each costs the CPU of the thread that
// calls it, and the two latencies that decide how a stream and the host hand over work.
//
//   HostFnRoundTrip      a host function enqueued on an idle stream until it has run
//                        (cudaLaunchHostFunc; the emulation's BRAID_EMU_HOSTFN_US)
//   WaitRelease          a stream waiting on a word (cuStreamWaitValue32) until the host
//                        sets it, then writes a second word (cuStreamWriteValue32) that the
//                        host polls: the host-to-stream-to-host hand-over the device path
//                        makes per network receive
//   CopyAsyncCall        the CPU cost of enqueueing a 4 KiB pinned-to-device copy
//   WriteValueCall       the CPU cost of enqueueing a flag write
//   EventRecordCall      the CPU cost of recording an event
//   LaunchCall           the CPU cost of launching braid's reduce kernel on 1 value (CUDA),
//                        or the emulation's stand-in for a kernel
//
// The latencies are wall time per hand-over (manual time); the call costs are CPU time
// of the calling thread, with the stream drained every 256 calls outside the timing.
//
// Run: BRAID_GPU_BACKEND=cuda bench_gpu_runtime [--benchmark_format=csv]
// Without a device runtime it says why and exits 0.
#include "core/config.hpp"
#include "core/device_exec.hpp"
#include "gpu/runtime.hpp"

#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>

namespace {

using Clock = std::chrono::steady_clock;
using braid::gpu::Runtime;
using braid::gpu::Stream;

Runtime& rt() { return braid::core::gpu_runtime(); }

/// A stream of device 0 and two pinned words, for one benchmark.
struct Rig {
  Rig() {
    rt().set_device(0);
    s = rt().create_stream();
    words = static_cast<std::uint32_t*>(rt().alloc_pinned(2 * sizeof(std::uint32_t)));
    words[0] = words[1] = 0;
  }
  ~Rig() {
    rt().synchronize(s);
    rt().destroy_stream(s);
    rt().free_pinned(words);
  }
  Stream s = nullptr;
  std::uint32_t* words = nullptr;
};

void HostFnRoundTrip(benchmark::State& state) {
  Rig rig;
  std::atomic<int> ran{0};
  auto fn = [](void* p) { static_cast<std::atomic<int>*>(p)->fetch_add(1, std::memory_order_release); };
  int want = 0;
  for (auto _ : state) {
    rt().launch_host(rig.s, fn, &ran);
    ++want;
    while (ran.load(std::memory_order_acquire) != want) {
    }
  }
}
BENCHMARK(HostFnRoundTrip)->UseRealTime();

void WaitRelease(benchmark::State& state) {
  Rig rig;
  std::uint32_t v = 0;
  for (auto _ : state) {
    ++v;
    rt().wait_value(rig.s, &rig.words[0], v);
    rt().write_value(rig.s, &rig.words[1], v);
    // Let the stream reach its wait before the clock starts: the hand-over alone.
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    const auto t0 = Clock::now();
    rt().signal(&rig.words[0], v);
    while (__atomic_load_n(&rig.words[1], __ATOMIC_ACQUIRE) != v) {
    }
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count());
  }
}
BENCHMARK(WaitRelease)->UseManualTime();

/// Times `call` on the calling thread's CPU clock, draining the stream every 256 calls
/// (outside the timing) so that queues stay short.
template <typename F>
void call_cost(benchmark::State& state, Rig& rig, F call) {
  int n = 0;
  for (auto _ : state) {
    call();
    if (++n % 256 == 0) {
      state.PauseTiming();
      rt().synchronize(rig.s);
      state.ResumeTiming();
    }
  }
}

void CopyAsyncCall(benchmark::State& state) {
  Rig rig;
  constexpr std::size_t kBytes = 4096;
  void* host = rt().alloc_pinned(kBytes);
  void* dev = rt().alloc_device(kBytes, 0);
  call_cost(state, rig, [&] { rt().copy_async(dev, host, kBytes, rig.s); });
  rt().synchronize(rig.s);
  rt().free_device(dev);
  rt().free_pinned(host);
}
BENCHMARK(CopyAsyncCall);

void WriteValueCall(benchmark::State& state) {
  Rig rig;
  std::uint32_t v = 0;
  call_cost(state, rig, [&] { rt().write_value(rig.s, &rig.words[1], ++v); });
}
BENCHMARK(WriteValueCall);

void EventRecordCall(benchmark::State& state) {
  Rig rig;
  braid::gpu::Event e = rt().create_event();
  call_cost(state, rig, [&] { rt().record_event(e, rig.s); });
  rt().synchronize(rig.s);
  rt().destroy_event(e);
}
BENCHMARK(EventRecordCall);

void LaunchCall(benchmark::State& state) {
  braid::core::DeviceExec d(rt(), 0);
  auto* x = static_cast<float*>(rt().alloc_device(sizeof(float), 0));
  int n = 0;
  for (auto _ : state) {
    d.reduce(braid::DataType::f32, braid::ReduceOp::sum, x, x, x, 1);
    if (++n % 256 == 0) {
      state.PauseTiming();
      d.synchronize();
      state.ResumeTiming();
    }
  }
  d.synchronize();
  rt().free_device(x);
}
BENCHMARK(LaunchCall);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  try {
    if (rt().device_count() == 0) {
      std::printf("bench_gpu_runtime: skipped: no device runtime (%s)\n", rt().describe().c_str());
      return 0;
    }
  } catch (const std::exception& e) {
    std::printf("bench_gpu_runtime: skipped: no device runtime (%s)\n", e.what());
    return 0;
  }
  benchmark::AddCustomContext("device_runtime", rt().describe());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
