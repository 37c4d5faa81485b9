// Device execution of plans (see device_exec.hpp).
#include "core/device_exec.hpp"

#include "base/check.hpp"
#include "base/logging.hpp"
#include "compression/framed.hpp"
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

/// Enqueues fn on `s` as the emulated backend's stand-in for a kernel
/// (Runtime::launch_emulated_kernel: the host kernel on the stream's executor, counted as
/// a launch). No host function is enqueued on any backend.
void enqueue_kernel(gpu::Runtime& rt, gpu::Stream s, std::function<void()> fn) {
  auto* h = new HostFn{std::move(fn)};
  try {
    rt.launch_emulated_kernel(s, &HostFn::run, h);
  } catch (...) {
    delete h;
    throw;
  }
}

constexpr std::size_t kRound = 4096;

std::atomic<int> g_made{0};
std::atomic<long> g_codec_steps{0};

#if BRAID_HAVE_CUDA
namespace kc = kernels::cuda;

/// The device kernels' view of `spec` for a payload starting at global index `offset`.
kc::DeviceCodec device_codec(const compression::CodecSpec& spec, std::uint64_t step, std::uint64_t offset) {
  kc::DeviceCodec c;
  switch (spec.kind) {
    case compression::CodecKind::none: c.kind = kc::DeviceCodec::Kind::raw; break;
    case compression::CodecKind::fp16: c.kind = kc::DeviceCodec::Kind::fp16; break;
    case compression::CodecKind::bf16: c.kind = kc::DeviceCodec::Kind::bf16; break;
    case compression::CodecKind::int8:
    case compression::CodecKind::int4:
    case compression::CodecKind::fp8e4m3:
    case compression::CodecKind::fp8e5m2:
    case compression::CodecKind::sign1:
    case compression::CodecKind::mxfp8:
    case compression::CodecKind::mxfp4:
      c.kind = kc::DeviceCodec::Kind::block;
      c.block = compression::block_params(spec, step, offset);
      break;
    default:
      throw Error(ErrorCode::Internal, "codec " + compression::name(spec) + " has no block kernel on the device");
  }
  return c;
}

/// fp16/bf16 payloads are 2 bytes per value with no per-frame header, and a frame is a
/// multiple of 8 values: the framed layout of n values is byte for byte one payload of n
/// values. Block formats have scales at the head of each frame: their kernels take the
/// frame. Either way one launch encodes (or decodes) every frame of a step.
bool frames_are_contiguous(const compression::CodecSpec& spec) {
  return spec.kind == compression::CodecKind::fp16 || spec.kind == compression::CodecKind::bf16 ||
         spec.kind == compression::CodecKind::none;
}

void check_launch(kc::Status st, const char* what, std::size_t n) {
  BRAID_CHECK(st == 0, Cuda, "device " << what << " of " << n << " values failed: " << kc::status_string(st));
}
#endif

}  // namespace

// The engine's thread keeps the device once set: restoring "its" device would make it
// current, and on CUDA 12 setting a device creates its context (GPU 0's, for every rank).
/// The device current, and the thread in relaxed capture mode (braid's own allocations
/// and waits never invalidate an application's capture on another thread).
class DeviceExec::OnDevice : public gpu::ScopedDevice {
 public:
  explicit OnDevice(DeviceExec& d) : ScopedDevice(d.rt_, d.device_, true), relaxed_(d.rt_) {}

 private:
  gpu::RelaxedCapture relaxed_;
};

DeviceExec::DeviceExec(gpu::Runtime& runtime, int device) : rt_(runtime), device_(device) {
  OnDevice on(*this);
  stream_ = rt_.create_stream();
  g_made.fetch_add(1, std::memory_order_relaxed);
  BRAID_LOG(info, "device path: plans run on a stream of GPU " << device_ << " (" << rt_.describe() << ")");
}

DeviceExec::~DeviceExec() {
  gpu::RelaxedCapture relaxed(rt_);
  try {
    OnDevice on(*this);
    rt_.synchronize(stream_);
  } catch (const std::exception& e) {
    // The device failed: its memory may still be in use by nothing we can wait for.
    BRAID_LOG(warn, "device execution: waiting for the device path's stream failed (" << e.what()
                                                                                  << "); its buffers are left allocated");
    return;
  }
  if (topk_status_) rt_.free_pinned(topk_status_);
  for (auto& [bytes, p] : device_mem_.all) rt_.free_device(p);
  rt_.destroy_stream(stream_);
}

int DeviceExec::made() noexcept { return g_made.load(std::memory_order_relaxed); }
long DeviceExec::codec_steps() noexcept { return g_codec_steps.load(std::memory_order_relaxed); }

std::byte* DeviceExec::take_device(std::size_t bytes) {
  bytes = (std::max<std::size_t>(bytes, 1) + kRound - 1) / kRound * kRound;
  auto best = device_mem_.free.end();
  for (auto it = device_mem_.free.begin(); it != device_mem_.free.end(); ++it)
    if (it->first >= bytes && (best == device_mem_.free.end() || it->first < best->first)) best = it;
  if (best != device_mem_.free.end()) {
    std::byte* p = best->second;
    device_mem_.free.erase(best);
    return p;
  }
  OnDevice on(*this);
  auto* p = static_cast<std::byte*>(rt_.alloc_device(bytes, device_));
  device_mem_.all.emplace_back(bytes, p);
  return p;
}

void DeviceExec::give_device(std::byte* p) noexcept {
  if (p == nullptr) return;
  for (const auto& e : device_mem_.all)
    if (e.second == p) {
      device_mem_.free.push_back(e);
      return;
    }
}

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
    gpu::count_launch();
    const auto st = kernels::cuda::reduce(args, static_cast<kernels::cuda::Stream>(stream_));
    BRAID_CHECK(st == 0, Cuda, "device reduce of " << n << " x " << to_string(dtype) << " failed: "
                                                   << kernels::cuda::status_string(st));
    return;
  }
#endif
  enqueue_kernel(rt_, stream_, [=] { kernels::reduce(dtype, op, dst, a, b, n); });
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
    gpu::count_launch();
    const auto st = kernels::cuda::divide(args, static_cast<kernels::cuda::Stream>(stream_));
    BRAID_CHECK(st == 0, Cuda, "device divide of " << n << " x " << to_string(dtype) << " failed: "
                                                   << kernels::cuda::status_string(st));
    return;
  }
#endif
  enqueue_kernel(rt_, stream_, [=] { kernels::divide(dtype, buf, n, divisor); });
}

void DeviceExec::scale(DataType dtype, void* dst, const void* src, std::size_t n, double factor) {
  if (n == 0) return;
  OnDevice on(*this);
#if BRAID_HAVE_CUDA
  if (rt_.backend() == gpu::Backend::cuda) {
    kernels::cuda::ScaleArgs args;
    args.dtype = dtype;
    args.dst = dst;
    args.src = src;
    args.n = n;
    args.factor = factor;
    gpu::count_launch();
    const auto st = kernels::cuda::scale(args, static_cast<kernels::cuda::Stream>(stream_));
    BRAID_CHECK(st == 0, Cuda, "device scale of " << n << " x " << to_string(dtype) << " failed: "
                                                  << kernels::cuda::status_string(st));
    return;
  }
#endif
  enqueue_kernel(rt_, stream_, [=] { kernels::scale(dtype, dst, src, n, factor); });
}

void DeviceExec::reduce_scaled(DataType dtype, void* dst, const void* a, const void* b, std::size_t n,
                               double factor) {
  if (n == 0) return;
  OnDevice on(*this);
#if BRAID_HAVE_CUDA
  if (rt_.backend() == gpu::Backend::cuda) {
    kernels::cuda::ReduceScaledArgs args;
    args.dtype = dtype;
    args.dst = dst;
    args.a = a;
    args.b = b;
    args.n = n;
    args.factor = factor;
    gpu::count_launch();
    const auto st = kernels::cuda::reduce_scaled(args, static_cast<kernels::cuda::Stream>(stream_));
    BRAID_CHECK(st == 0, Cuda, "device scaled reduce of " << n << " x " << to_string(dtype) << " failed: "
                                                          << kernels::cuda::status_string(st));
    return;
  }
#endif
  enqueue_kernel(rt_, stream_, [=] { kernels::reduce_scaled(dtype, dst, a, b, n, factor); });
}

void DeviceExec::encode(const compression::CodecSpec& spec, std::size_t frame, const float* x, float* residual,
                        std::size_t n, std::uint8_t* out, std::uint64_t step, std::uint64_t offset) {
  if (n == 0) return;
  g_codec_steps.fetch_add(1, std::memory_order_relaxed);
  OnDevice on(*this);
#if BRAID_HAVE_CUDA
  if (rt_.backend() == gpu::Backend::cuda) {
    const auto stream = static_cast<kc::Stream>(stream_);
    const std::size_t fb = compression::encoded_bytes(spec, frame);
    if (spec.kind == compression::CodecKind::topk) {
      // A topk payload is never cut (its frame is the whole payload).
      for (std::size_t b = 0; b < n; b += frame, out += fb) {
        const std::size_t m = std::min(frame, n - b);
        kc::TopkEncodeArgs a;
        a.in = x + b;
        a.add = residual ? residual + b : nullptr;
        a.n = m;
        a.k = compression::topk_k(spec, m);
        a.out = out;
        a.residual = residual ? residual + b : nullptr;
        a.workspace_bytes = kc::topk_workspace_bytes(m, a.k);
        BRAID_CHECK(a.workspace_bytes > 0, Cuda, "device topk encode of " << m << " values: no workspace size");
        std::byte* ws = take_device(a.workspace_bytes);
        a.workspace = ws;
        gpu::count_launch();
        const auto st = kc::topk_encode(a, stream);
        give_device(ws);  // reused only by work enqueued later on this stream
        check_launch(st, "topk encode", m);
      }
      return;
    }
    // Every frame in one launch (the kernel finds each block's frame).
    kc::EncodeArgs a;
    a.codec = device_codec(spec, step, offset);
    a.in = x;
    a.add = residual;
    a.n = n;
    a.out = out;
    a.residual = residual;
    a.frame = frames_are_contiguous(spec) ? 0 : frame;
    gpu::count_launch();
    check_launch(kc::encode(a, stream), "encode", n);
    return;
  }
#endif
  enqueue_kernel(rt_, stream_, [this, spec, frame, x, residual, n, out, step, offset] {
    try {
      compression::encode_framed(spec, frame, x, residual, n, out, step, offset);
    } catch (const std::exception& e) {
      fail(std::string("encode on the device: ") + e.what());
    }
  });
}

void DeviceExec::decode(const compression::CodecSpec& spec, std::size_t frame, const std::uint8_t* in, std::size_t n,
                        float* out, bool sum_start, const std::string& what) {
  decode_framed(spec, frame, in, n, out, false, sum_start, what);
}

void DeviceExec::decode_add(const compression::CodecSpec& spec, std::size_t frame, const std::uint8_t* in,
                            std::size_t n, float* acc, const std::string& what) {
  decode_framed(spec, frame, in, n, acc, true, false, what);
}

void DeviceExec::decode_framed(const compression::CodecSpec& spec, std::size_t frame, const std::uint8_t* in,
                               std::size_t n, float* out, bool accumulate, bool sum_start, const std::string& what) {
  if (n == 0) return;
  g_codec_steps.fetch_add(1, std::memory_order_relaxed);
  OnDevice on(*this);
#if BRAID_HAVE_CUDA
  if (rt_.backend() == gpu::Backend::cuda) {
    const auto stream = static_cast<kc::Stream>(stream_);
    // sum_start: +0.0f + decoded, so that a decoded -0.0f comes out as a sum from +0 would.
    if (sum_start) rt_.zero_async(out, n * sizeof(float), stream_);
    const bool add = accumulate || sum_start;
    const std::size_t fb = compression::encoded_bytes(spec, frame);
    if (spec.kind == compression::CodecKind::topk) {
      // Two pinned, mapped ints: each decode's status, and the sticky verdict failure()
      // reads once the program has run (no host function per decode).
      if (!topk_status_) {
        gpu::RelaxedCapture relaxed(rt_);
        auto* words = static_cast<int*>(rt_.alloc_pinned(2 * sizeof(int)));
        words[0] = words[1] = 0;
        std::lock_guard<std::mutex> lock(failure_mu_);  // failure() reads it on another thread
        topk_status_ = words;
      }
      for (std::size_t b = 0; b < n; b += frame, in += fb) {
        const std::size_t m = std::min(frame, n - b);
        kc::TopkDecodeArgs a;
        a.in = in;
        a.n = m;
        a.k = compression::topk_k(spec, m);
        a.out = out + b;
        a.accumulate = add;
        a.status = topk_status_;
        a.rejected = topk_status_ + 1;
        gpu::count_launch();
        check_launch(kc::topk_decode(a, stream), "topk decode", m);
      }
      std::lock_guard<std::mutex> lock(failure_mu_);
      topk_what_ = what;
      return;
    }
    kc::DecodeArgs a;
    a.codec = device_codec(spec, 0, 0);
    a.in = in;
    a.n = n;
    a.out = out;
    a.accumulate = add;
    a.frame = frames_are_contiguous(spec) ? 0 : frame;
    gpu::count_launch();
    check_launch(kc::decode(a, stream), "decode", n);
    return;
  }
#endif
  enqueue_kernel(rt_, stream_, [this, spec, frame, in, n, out, accumulate, sum_start, what] {
    try {
      if (accumulate)
        compression::decode_add_framed(spec, frame, in, n, out);
      else
        compression::decode_framed(spec, frame, in, n, out, sum_start);
    } catch (const std::exception& e) {
      fail(what + ": " + e.what());
    }
  });
}

void DeviceExec::fail(std::string why) noexcept {
  try {
    std::lock_guard<std::mutex> lock(failure_mu_);
    if (failure_.empty()) failure_ = std::move(why);
  } catch (...) {
  }
  failed_.store(true, std::memory_order_release);
}

std::string DeviceExec::failure() const {
  {
    std::lock_guard<std::mutex> lock(failure_mu_);
    if (topk_status_ && __atomic_load_n(topk_status_ + 1, __ATOMIC_ACQUIRE) != 0)
      return "a top-k payload from a peer has an index out of range or out of order (nothing of it was applied; "
             "seen once the call's program had run; the last top-k decode enqueued: " + topk_what_ + ")";
  }
  if (!failed_.load(std::memory_order_acquire)) return {};
  std::lock_guard<std::mutex> lock(failure_mu_);
  return failure_.empty() ? std::string("device work failed") : failure_;
}

void DeviceExec::synchronize() {
  OnDevice on(*this);
  rt_.synchronize(stream_);
}

}  // namespace braid::core
