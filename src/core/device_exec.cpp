// Device execution of plans (see device_exec.hpp).
#include "core/device_exec.hpp"

#include "base/check.hpp"
#include "base/logging.hpp"
#include "kernels/host/reduce.hpp"

#include <braid/config.hpp>

#if BRAID_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.hpp"
#endif

#include <algorithm>

namespace braid::core {

namespace {

/// A host function run on a stream, in stream order (it owns itself: the callback deletes
/// it): the host kernels on the emulated runtime, and notify()'s flag on every backend. It
/// must not call the runtime (CUDA forbids it in a host callback).
struct HostFn {
  std::function<void()> fn;
  static void run(void* p) noexcept {
    std::unique_ptr<HostFn> self(static_cast<HostFn*>(p));
    self->fn();
  }
};

void enqueue_host(gpu::Runtime& rt, gpu::Stream s, std::function<void()> fn) {
  auto* h = new HostFn{std::move(fn)};
  try {
    rt.launch_host(s, &HostFn::run, h);
  } catch (...) {
    delete h;
    throw;
  }
}

constexpr std::size_t kRound = 4096;

std::atomic<int> g_made{0};
std::atomic<long> g_slots{0};

}  // namespace

class DeviceExec::OnDevice {
 public:
  // The engine's thread keeps the device once set: restoring "its" device would make it
  // current, and on CUDA 12 setting a device creates its context (GPU 0's, for every rank).
  explicit OnDevice(DeviceExec& d) : rt_(d.rt_), want_(d.device_), restore_(std::this_thread::get_id() != d.engine_) {
    had_ = rt_.current_device();
    if (had_ != want_) rt_.set_device(want_);
  }
  ~OnDevice() {
    if (restore_ && had_ != want_) {
      try {
        rt_.set_device(had_);
      } catch (...) {
      }
    }
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  gpu::Runtime& rt_;
  int want_;
  bool restore_;
  int had_ = 0;
};

DeviceExec::DeviceExec(gpu::Runtime& runtime, int device, std::function<void()> wake, std::thread::id engine)
    : rt_(runtime), device_(device), engine_(engine), wake_(std::move(wake)) {
  OnDevice on(*this);
  stream_ = rt_.create_stream();
  g_made.fetch_add(1, std::memory_order_relaxed);
  BRAID_LOG(info, "direct device path: plans run on a stream of GPU " << device_ << " (" << rt_.describe() << ")");
}

DeviceExec::~DeviceExec() {
  try {
    OnDevice on(*this);
    rt_.synchronize(stream_);
  } catch (const std::exception& e) {
    // The device failed: its memory may still be in use by nothing we can wait for.
    BRAID_LOG(warn, "device execution: waiting for the engine's stream failed (" << e.what()
                                                                                  << "); its buffers are left allocated");
    return;
  }
  for (auto& [bytes, p] : pinned_.all) rt_.free_pinned(p);
  for (auto& [bytes, p] : device_mem_.all) rt_.free_device(p);
  rt_.destroy_stream(stream_);
}

int DeviceExec::made() noexcept { return g_made.load(std::memory_order_relaxed); }
long DeviceExec::slots_taken() noexcept { return g_slots.load(std::memory_order_relaxed); }

std::byte* DeviceExec::take(Pool& pool, std::size_t bytes, bool pinned) {
  bytes = (std::max<std::size_t>(bytes, 1) + kRound - 1) / kRound * kRound;
  auto best = pool.free.end();
  for (auto it = pool.free.begin(); it != pool.free.end(); ++it)
    if (it->first >= bytes && (best == pool.free.end() || it->first < best->first)) best = it;
  if (best != pool.free.end()) {
    std::byte* p = best->second;
    pool.free.erase(best);
    return p;
  }
  OnDevice on(*this);
  auto* p = static_cast<std::byte*>(pinned ? rt_.alloc_pinned(bytes) : rt_.alloc_device(bytes, device_));
  pool.all.emplace_back(bytes, p);
  return p;
}

void DeviceExec::give(Pool& pool, std::byte* p) noexcept {
  if (p == nullptr) return;
  for (const auto& e : pool.all)
    if (e.second == p) {
      pool.free.push_back(e);
      return;
    }
}

std::byte* DeviceExec::take_pinned(std::size_t bytes) {
  g_slots.fetch_add(1, std::memory_order_relaxed);
  return take(pinned_, bytes, true);
}
void DeviceExec::give_pinned(std::byte* p) noexcept { give(pinned_, p); }
std::byte* DeviceExec::take_device(std::size_t bytes) { return take(device_mem_, bytes, false); }
void DeviceExec::give_device(std::byte* p) noexcept { give(device_mem_, p); }

void DeviceExec::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0 || dst == src) return;
  OnDevice on(*this);
  rt_.copy_async(dst, src, bytes, stream_);
}

void DeviceExec::reduce(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b, std::size_t n) {
  if (n == 0) return;
  OnDevice on(*this);
#if BRAID_HAVE_CUDA
  if (rt_.backend() == gpu::Backend::cuda) {
    kernels::cuda::ReduceArgs args;
    args.dtype = dtype;
    args.op = op;
    args.dst = dst;
    args.a = a;
    args.b = b;
    args.n = n;
    const auto st = kernels::cuda::reduce(args, static_cast<kernels::cuda::Stream>(stream_));
    BRAID_CHECK(st == 0, Cuda, "device reduce of " << n << " x " << to_string(dtype) << " failed: "
                                                   << kernels::cuda::status_string(st));
    return;
  }
#endif
  enqueue_host(rt_, stream_, [=] { kernels::reduce(dtype, op, dst, a, b, n); });
}

void DeviceExec::divide(DataType dtype, void* buf, std::size_t n, int divisor) {
  if (n == 0) return;
  OnDevice on(*this);
#if BRAID_HAVE_CUDA
  if (rt_.backend() == gpu::Backend::cuda) {
    kernels::cuda::DivideArgs args;
    args.dtype = dtype;
    args.buf = buf;
    args.n = n;
    args.divisor = divisor;
    const auto st = kernels::cuda::divide(args, static_cast<kernels::cuda::Stream>(stream_));
    BRAID_CHECK(st == 0, Cuda, "device divide of " << n << " x " << to_string(dtype) << " failed: "
                                                   << kernels::cuda::status_string(st));
    return;
  }
#endif
  enqueue_host(rt_, stream_, [=] { kernels::divide(dtype, buf, n, divisor); });
}

std::shared_ptr<std::atomic<bool>> DeviceExec::notify() {
  auto flag = std::make_shared<std::atomic<bool>>(false);
  OnDevice on(*this);
  enqueue_host(rt_, stream_, [flag, wake = wake_] {
    flag->store(true, std::memory_order_release);
    wake();
  });
  return flag;
}

void DeviceExec::synchronize() {
  OnDevice on(*this);
  rt_.synchronize(stream_);
}

bool DeviceExec::drain(std::chrono::milliseconds limit) noexcept {
  try {
    const auto ran = notify();
    const auto until = std::chrono::steady_clock::now() + limit;
    while (!ran->load(std::memory_order_acquire)) {
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace braid::core
