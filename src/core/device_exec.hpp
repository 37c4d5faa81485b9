// Device execution of plans (docs/gpu.md, "The direct path"): what the engine needs to run
// a plan's steps on device buffers. Local steps (reduce, copy, the avg division) are
// braid's kernels enqueued on one stream the engine owns; a transfer over a transport
// that takes host memory moves through a pinned host slot of its own size (device to
// slot, send; receive, slot to device). The engine learns that the work enqueued for a
// step has run through a flag that a host callback on the stream sets (then it wakes
// the engine), so the engine never blocks on the device while it has other work.
//
// Kernels: the CUDA backend launches src/kernels/cuda; the emulated backend runs the
// host kernels (src/kernels/host) on its stream thread, in stream order. Results are the
// host path's bit for bit either way (the kernels' contract).
//
// Engine thread only (and helpers that drive the engine under its lock): no method is
// thread-safe. Buffers taken here stay allocated until the DeviceExec is destroyed and
// are reused by later operations (alloc_pinned and cudaMalloc are slow; an operation's
// pattern of sizes repeats from one training step to the next).
#pragma once

#include "compression/codec.hpp"
#include "gpu/runtime.hpp"

#include <braid/types.hpp>

#include <atomic>
#include <chrono>
#include <thread>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace braid::core {

class DeviceExec {
 public:
  /// A stream of `device` on `runtime`; `wake` wakes the engine (any thread). `engine`
  /// is the engine's thread, which keeps `device` current once set; other threads that
  /// drive the engine (helping waiters) get their own device back after each call.
  DeviceExec(gpu::Runtime& runtime, int device, std::function<void()> wake, std::thread::id engine);
  /// Waits for the stream, then frees every buffer. Never throws.
  ~DeviceExec();
  DeviceExec(const DeviceExec&) = delete;
  DeviceExec& operator=(const DeviceExec&) = delete;

  int device() const noexcept { return device_; }
  /// The stream everything is enqueued on (core::DeviceFlow adds its waits and words there).
  gpu::Stream stream() const noexcept { return stream_; }
  /// How many DeviceExecs this process has made (tests: that the direct path ran).
  static int made() noexcept;
  /// How many pinned slots this process's DeviceExecs have handed out (tests: that a
  /// connection taking device memory moved the data without any).
  static long slots_taken() noexcept;

  /// Pinned host memory of at least `bytes` (> 0), until give_pinned().
  std::byte* take_pinned(std::size_t bytes);
  void give_pinned(std::byte* p) noexcept;
  /// Device memory of at least `bytes` (> 0), until give_device().
  std::byte* take_device(std::size_t bytes);
  void give_device(std::byte* p) noexcept;

  /// Enqueue on the stream (any direction: pinned, device).
  void copy(void* dst, const void* src, std::size_t bytes);
  /// dst[i] = a[i] (op) b[i] (avg adds), as kernels::reduce; dst may equal a or b.
  void reduce(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b, std::size_t n);
  /// buf[i] /= divisor (finishes avg), as kernels::divide.
  void divide(DataType dtype, void* buf, std::size_t n, int divisor);
  /// Compressed plans: the framed codec steps of compression/framed.hpp on the device
  /// (CUDA: src/kernels/cuda, one launch per frame for block codecs, one per payload for
  /// fp16/bf16 and topk; emulated: the host functions on the stream thread). Bit for bit
  /// what encode_framed, decode_framed and decode_add_framed compute on the host.
  void encode(const compression::CodecSpec& spec, std::size_t frame, const float* x, float* residual, std::size_t n,
              std::uint8_t* out, std::uint64_t step, std::uint64_t offset);
  /// `what` names the step in the error a malformed payload (a peer's topk indices out
  /// of range or not ascending) gives; see failure().
  void decode(const compression::CodecSpec& spec, std::size_t frame, const std::uint8_t* in, std::size_t n, float* out,
              bool sum_start, const std::string& what);
  void decode_add(const compression::CodecSpec& spec, std::size_t frame, const std::uint8_t* in, std::size_t n,
                  float* acc, const std::string& what);
  /// Why device work enqueued so far failed (a malformed payload), once it has run; empty
  /// when nothing failed. The engine reads it before it trusts a step's result.
  std::string failure() const;
  /// How many codec steps (encode, decode) DeviceExecs of this process have enqueued, and
  /// how many bytes went through their pinned slots (tests: that a compressed call ran on
  /// the device and only compressed bytes left it).
  static long codec_steps() noexcept;
  static long long slot_bytes() noexcept;

  /// A flag set (and the engine woken) once everything enqueued before this call has run.
  std::shared_ptr<std::atomic<bool>> notify();
  /// Blocks until everything enqueued has run (no kernel waits on a peer, so this is
  /// bounded by the device's own work). Throws Error(Cuda) on a device failure.
  void synchronize();
  /// Waits up to `limit` for everything enqueued so far to run; false when it has not
  /// (the stream is held up by other work of the device). Never throws.
  bool drain(std::chrono::milliseconds limit) noexcept;

 private:
  /// Makes this DeviceExec's device current on the calling thread for its lifetime and
  /// restores the thread's own afterwards (a helping user thread keeps its device).
  class OnDevice;
  struct Pool {
    std::vector<std::pair<std::size_t, std::byte*>> all, free;
  };
  std::byte* take(Pool& pool, std::size_t bytes, bool pinned);
  static void give(Pool& pool, std::byte* p) noexcept;

  gpu::Runtime& rt_;
  const int device_;
  const std::thread::id engine_;
  std::function<void()> wake_;
  void decode_framed(const compression::CodecSpec& spec, std::size_t frame, const std::uint8_t* in, std::size_t n,
                     float* out, bool accumulate, bool sum_start, const std::string& what);
  void fail(std::string why) noexcept;

  gpu::Stream stream_ = nullptr;
  Pool pinned_, device_mem_;
  int* topk_status_ = nullptr;  ///< pinned: the CUDA topk decoder's verdict, read by a host function after it
  std::atomic<bool> failed_{false};  ///< set after failure_ (the engine reads this first, every step)
  mutable std::mutex failure_mu_;
  std::string failure_;
};

}  // namespace braid::core
