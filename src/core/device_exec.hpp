// Device work of the device path (core::DeviceFlow, docs/gpu.md "The device path"): one
// stream of a device, and the work a plan's steps put on it: copies, braid's reduce and
// divide kernels, and the framed codec steps, enqueued in the order they are called.
// DeviceFlow adds its waits and flag writes to the same stream.
//
// Kernels: the CUDA backend launches src/kernels/cuda; the emulated backend runs the
// host kernels (src/kernels/host) on its stream thread, in stream order. Results are the
// host path's bit for bit either way (the kernels' contract).
//
// One thread at a time (DeviceFlow's enqueue lock): no method is thread-safe. Device
// memory taken here (codec workspaces) stays allocated until the DeviceExec is destroyed
// and is reused by later work.
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
  /// A stream of `device` on `runtime`. Each call makes `device` current on the calling
  /// thread and gives the thread its own device back afterwards.
  DeviceExec(gpu::Runtime& runtime, int device);
  /// Waits for the stream, then frees every buffer. Never throws.
  ~DeviceExec();
  DeviceExec(const DeviceExec&) = delete;
  DeviceExec& operator=(const DeviceExec&) = delete;

  int device() const noexcept { return device_; }
  /// The stream everything is enqueued on (core::DeviceFlow adds its waits and words there).
  gpu::Stream stream() const noexcept { return stream_; }
  /// How many DeviceExecs this process has made (tests: that the device path ran).
  static int made() noexcept;

  /// Device memory of at least `bytes` (> 0), until give_device().
  std::byte* take_device(std::size_t bytes);
  void give_device(std::byte* p) noexcept;

  /// Enqueue on the stream (any direction: pinned, device).
  void copy(void* dst, const void* src, std::size_t bytes);
  /// dst[i] = a[i] (op) b[i] (avg adds), as kernels::reduce; dst may equal a or b.
  void reduce(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b, std::size_t n);
  /// buf[i] /= divisor (finishes avg), as kernels::divide.
  void divide(DataType dtype, void* buf, std::size_t n, int divisor);
  /// dst[i] = src[i] * factor (premul_sum's input), as kernels::scale; dst may equal src.
  void scale(DataType dtype, void* dst, const void* src, std::size_t n, double factor);
  /// dst[i] = a[i] + scale(b[i]) (premul_sum), as kernels::reduce_scaled.
  void reduce_scaled(DataType dtype, void* dst, const void* a, const void* b, std::size_t n, double factor);
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
  /// when nothing failed. Read (DeviceFlow) once a call's program has run to its end.
  std::string failure() const;
  /// How many codec steps (encode, decode) DeviceExecs of this process have enqueued
  /// (tests: that a compressed call ran on the device).
  static long codec_steps() noexcept;

  /// Blocks until everything enqueued has run (tests). Throws Error(Cuda) on a device failure.
  void synchronize();

 private:
  /// Makes this DeviceExec's device current on the calling thread for its lifetime and
  /// restores the thread's own afterwards (a helping user thread keeps its device).
  class OnDevice;
  /// Device memory taken (all) and given back (free), as (bytes, address).
  struct Pool {
    std::vector<std::pair<std::size_t, std::byte*>> all, free;
  };

  gpu::Runtime& rt_;
  const int device_;
  void decode_framed(const compression::CodecSpec& spec, std::size_t frame, const std::uint8_t* in, std::size_t n,
                     float* out, bool accumulate, bool sum_start, const std::string& what);
  void fail(std::string why) noexcept;

  gpu::Stream stream_ = nullptr;
  Pool device_mem_;
  /// Pinned and mapped (CUDA): [0] each top-k decode's status, [1] set by any that rejected
  /// its payload, read by failure() once the program has run; topk_what_ names the last
  /// top-k decode enqueued (a call's decodes come before its end word, which failure()
  /// is read after).
  int* topk_status_ = nullptr;
  std::string topk_what_;
  std::atomic<bool> failed_{false};  ///< set after failure_ (the engine reads this first, every step)
  mutable std::mutex failure_mu_;
  std::string failure_;
};

}  // namespace braid::core
