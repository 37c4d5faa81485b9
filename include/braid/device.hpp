// braid — device memory and streams through braid's device runtime (docs/gpu.md).
//
// Programs that use CUDA allocate with cudaMalloc and pass cudaStream_t streams; these
// helpers exist for programs that do not link CUDA themselves (allreduce_bench
// --device, tests) and, like NCCL's ncclMemAlloc, work on whichever device runtime the
// process has: CUDA, or the host emulation (BRAID_GPU_BACKEND=emulated, tests only).
// Every function is thread-safe; failures throw braid::Error (Unsupported without a
// device runtime, Cuda when the runtime refuses).
#pragma once

#include <braid/export.hpp>
#include <braid/types.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace braid::device {

/// The device runtime this process uses: "cuda: 1 device (NVIDIA H100 ...)", "emulated
/// (tests only): ...", or "none: <why>".
BRAID_API std::string runtime();
/// Number of devices (0: none).
BRAID_API int count() noexcept;
/// Makes `device` the calling thread's current device (cudaSetDevice): streams created,
/// memory allocated with device -1 and communicators created (CommOptions::device -1)
/// afterwards on this thread use it. Throws InvalidUsage for a device that does not exist.
BRAID_API void set_device(int device);
/// The calling thread's current device (0 when the runtime has devices and none was set;
/// -1 without a device runtime).
BRAID_API int current_device();

/// Where `p` points, as a collective with MemoryKind::automatic would classify it: `device`
/// for device or managed memory of any GPU, else `host` (always `host` without a device
/// runtime). One pointer query.
BRAID_API MemoryKind memory_kind(const void* p);

/// `bytes` of device memory on `device` (-1: the calling thread's current device).
BRAID_API void* alloc(std::size_t bytes, int device = -1);
/// Frees what alloc() returned (nullptr is fine).
BRAID_API void free(void* p) noexcept;
/// Synchronous copy of `bytes` bytes in any direction (host <-> device, device <-> device).
BRAID_API void copy(void* dst, const void* src, std::size_t bytes);
/// A new stream (cudaStream_t for CUDA) on the calling thread's current device, for the
/// `stream` option of collectives.
BRAID_API void* create_stream();
/// Destroys a stream from create_stream() once its work is done (nullptr is fine).
BRAID_API void destroy_stream(void* stream) noexcept;
/// Blocks until everything enqueued on `stream` (nullptr: the default stream) has run.
BRAID_API void synchronize(void* stream);

/// What this process's device runtime has been asked to do so far, by kind: the budgets of
/// the device path (docs/gpu.md, "Budgets"). Process-wide and monotonic; take the
/// difference around the calls to measure (allreduce_bench --device prints it per call).
struct Counts {
  std::uint64_t progress_api = 0;  ///< runtime calls on a progress thread (braid's engines)
  std::uint64_t caller_api = 0;    ///< runtime calls on any other thread (the callers')
  std::uint64_t hostfn = 0;        ///< host functions enqueued on streams (cudaLaunchHostFunc)
  std::uint64_t sync = 0;          ///< host waits for a stream or the device (synchronize, copy, free)
  std::uint64_t launch = 0;        ///< kernel launches
  std::uint64_t memops = 0;        ///< stream write/wait value operations (cuStreamWriteValue32, ...)
};
/// The counts so far (any backend; all zero where no device runtime was ever used).
BRAID_API Counts counts() noexcept;

}  // namespace braid::device
