// braid's device runtime (DESIGN.md §1, "src/gpu"): the few device operations the
// library needs — classify a pointer, allocate device and pinned host memory, enqueue
// copies, host callbacks and waits on a host word on a stream — behind one interface
// with two backends:
//
// * cuda: the CUDA runtime, linked statically (it loads libcuda.so at run time, so
//   libbraid.so has no NEEDED entry on any CUDA library); the one driver entry point it
//   needs beyond the runtime (cuStreamWaitValue32) comes from
//   cudaGetDriverEntryPointByVersion, as NCCL's cudawrap does.
// * emulated (tests only; BRAID_GPU_BACKEND=emulated): "device" memory is host memory
//   recorded as device memory of device 0 or 1; streams are mapped round-robin onto a
//   few FIFO executor threads per device (the hardware queues, BRAID_EMU_HW_QUEUES), so
//   that a stream wait blocks every stream of its queue as on a GPU; host functions run
//   on one process-wide callback thread, and free_device waits for the whole device
//   (emulated.cpp says what else it models). It runs the whole device data path of the
//   library on a machine without a GPU, which is what CI has, and fails where a GPU
//   would. Each device allocation is its own memfd mapping, so that export_dmabuf() has a
//   file descriptor to hand out whose mmap aliases the allocation, as a NIC's
//   registration of a real dma-buf does.
//
// GPUDirect RDMA (a NIC reading and writing device memory) takes two primitives here:
// export_dmabuf() for the registration (ibv_reg_dmabuf_mr, no nvidia-peermem needed) and
// flush_rdma_writes() before the device reads what the NIC wrote.
//
// Device memory shared between processes of one host (the cuda_ipc transport) takes three:
// ipc_export() in the owner, ipc_open()/ipc_close() in the peer (legacy CUDA IPC,
// cudaIpcGetMemHandle / cudaIpcOpenMemHandle, as NCCL's p2p transport; the emulated
// backend hands out a duplicate of the allocation's memfd, which the peer maps).
//
// The backend is chosen once per process (core::gpu_runtime() reads BRAID_GPU_BACKEND);
// `none` (no CUDA in this build, or no GPU) classifies every pointer as host memory and
// refuses everything else with the reason.
//
// Uses only base and the public types (the layering rule).
#pragma once

#include <braid/device.hpp>
#include <braid/types.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace braid::gpu {

/// A stream handle: cudaStream_t for the CUDA backend, the emulated backend's own
/// stream object otherwise. nullptr is the (legacy) default stream.
using Stream = void*;

/// Which implementation runs device operations.
enum class Backend : std::uint8_t {
  none,      ///< no device: every pointer is host memory
  cuda,      ///< NVIDIA GPUs through the CUDA runtime
  emulated,  ///< host emulation (tests only)
};

/// "none", "cuda" or "emulated".
const char* to_string(Backend b) noexcept;

/// What a pointer is (Runtime::classify).
struct PointerInfo {
  MemoryKind kind = MemoryKind::host;  ///< host (pageable or pinned) or device (device, managed)
  int device = -1;                     ///< its device (device memory only)
};

/// An event handle: cudaEvent_t for the CUDA backend (made with timing off), the emulated
/// backend's own event otherwise.
using Event = void*;

/// What the device runtime of this process has been asked to do, counted per kind for the
/// budgets of the device path: braid::device::Counts (the public face, include/braid/
/// device.hpp, says what each field counts). A runtime call is a call of any Runtime
/// method that is a driver call on CUDA, refused or not: all but backend, describe,
/// device_count, hw_queues, rdma_flushes, emulation and signal (a host store: the progress
/// thread writes flags with it at no driver cost).
using Counts = braid::device::Counts;
/// The process's counts so far (any backend).
Counts counts() noexcept;
/// Marks the calling thread as a progress thread (its runtime calls count as progress_api)
/// for the rest of its life.
void mark_progress_thread() noexcept;
/// Counts one kernel launch (the launcher calls it: kernels are not runtime methods).
void count_launch() noexcept;
namespace detail {
/// Counts one runtime call on the calling thread (backends call it on entry).
void count_api() noexcept;
/// Counts one event of a kind (hostfn, sync, memops) besides the call itself.
enum class Kind : std::uint8_t { hostfn, sync, memops };
void count(Kind k) noexcept;
}  // namespace detail

/// Settings of the emulated backend (tests only): BRAID_EMU_HW_QUEUES and
/// BRAID_EMU_HOSTFN_US of the configuration table (docs/configuration.md).
struct EmulationOptions {
  int hw_queues = 8;  ///< executors (hardware queues) per device, as CUDA_DEVICE_MAX_CONNECTIONS; >= 1
  int hostfn_us = 5;  ///< latency before each host function, microseconds (0: none)
  /// CUDA's lazy loading: the first launch of each kernel on a device that load_kernels()
  /// has not loaded waits until every stream of the device is idle (BRAID_EMU_LAZY_LOADING).
  bool lazy_loading = true;
};

/// What the process's runtime is made with (runtime(); core::gpu_runtime() fills it from
/// the configuration table, since only src/core/config.cpp reads the environment).
struct RuntimeOptions {
  /// CUDA_DEVICE_MAX_CONNECTIONS as the driver reads it (8 when unset): the hardware queues
  /// that the CUDA backend's hw_queues() reports. The driver applies the variable itself.
  int cuda_max_connections = 8;
  EmulationOptions emulation;
};

class Runtime;

/// What tests of the emulated backend may do to it besides the Runtime interface: the
/// hazards of a real driver that a test provokes on purpose. Other backends have none
/// (emulation_hooks() returns null).
class EmulationHooks {
 public:
  virtual ~EmulationHooks() = default;
  /// Begins a capture of `s` in cudaStreamCaptureModeGlobal: until end_global_capture, a
  /// call that is unsafe during a global capture (alloc_device, alloc_pinned, free_device,
  /// free_pinned, synchronize, copy) made by any thread (another thread's, and as CUDA
  /// also the capturing thread's own) invalidates the capture and throws Error(Cuda)
  /// naming it (free_* cannot throw: they leave the memory allocated); end_global_capture then throws too, as
  /// cudaStreamEndCapture returns cudaErrorStreamCaptureInvalidated.
  virtual void begin_global_capture(Stream s) = 0;
  virtual void end_global_capture(Stream s) = 0;
  /// Makes `device` fail as after a sticky error (an illegal address in a kernel): every
  /// later runtime call that touches the device throws Error(Cuda) saying "sticky", and
  /// host functions enqueued on its streams are no longer called (as CUDA documents).
  virtual void inject_sticky_error(int device) = 0;
  /// Device contexts made in this runtime: a device's is made the first time any thread
  /// makes it current or allocates on it (CUDA's primary context), once per process.
  virtual std::uint64_t contexts_made() const noexcept = 0;
  /// Whether a thread is inside free_device's quiesce, holding the driver lock (tests wait
  /// for it before provoking the deadlock it causes).
  virtual bool quiescing() const noexcept = 0;
  /// Page-locked bytes allocated and not yet freed (alloc_pinned), now and at most since
  /// reset_pinned_peak() (which makes the peak what is held now).
  virtual std::size_t pinned_bytes() const noexcept = 0;
  virtual std::size_t pinned_peak() const noexcept = 0;
  virtual void reset_pinned_peak() noexcept = 0;
  /// Clears the sticky errors and ends the global captures (between tests).
  virtual void reset_hooks() noexcept = 0;
};

/// The hooks of `rt` when it is the emulated backend, else null.
EmulationHooks* emulation_hooks(Runtime& rt) noexcept;

/// What another process needs to map a device allocation (Runtime::ipc_export): opaque
/// bytes (CUDA: the cudaIpcMemHandle_t) and, for the emulated backend, a file descriptor
/// to pass over a Unix socket (SCM_RIGHTS); -1 when there is none. The holder owns `fd`.
struct IpcHandle {
  std::string bytes;
  int fd = -1;
};

/// The device runtime. Every method is thread-safe. Methods that enqueue return at once;
/// errors throw braid::Error(Cuda) naming the operation and the runtime's reason.
class Runtime {
 public:
  virtual ~Runtime() = default;
  virtual Backend backend() const noexcept = 0;
  /// One line for braid_info and errors: "cuda: 1 device (NVIDIA H100 ...)", "emulated
  /// (tests only): 2 devices", "none: <why>".
  virtual std::string describe() const = 0;
  /// Number of devices (0 for none).
  virtual int device_count() const noexcept = 0;
  /// The calling thread's current device (0 when the backend has devices and none was set).
  virtual int current_device() = 0;
  /// Makes `device` the calling thread's current device.
  virtual void set_device(int device) = 0;
  /// What `p` points to; host memory for anything the runtime does not know.
  virtual PointerInfo classify(const void* p) = 0;
  /// True when `s` is being captured into a graph.
  virtual bool capturing(Stream s) = 0;
  /// The PCI bus id of `device` as sysfs writes it ("0000:1b:00.0"); "" where the device
  /// is not a PCI device (emulated) or the runtime cannot tell.
  virtual std::string pci_bus_id(int device) = 0;
  /// Whether `device` can map `peer`'s memory (NVLink or PCIe peer-to-peer).
  virtual bool can_access_peer(int device, int peer) = 0;

  /// Device memory on `device` (freed with free_device).
  virtual void* alloc_device(std::size_t bytes, int device) = 0;
  virtual void free_device(void* p) noexcept = 0;
  /// Page-locked host memory that the device can copy from and to and that holds the
  /// host words of wait_value (freed with free_pinned).
  virtual void* alloc_pinned(std::size_t bytes) = 0;
  virtual void free_pinned(void* p) noexcept = 0;

  /// Streams the library or a test owns (nullptr is the default stream, never created).
  virtual Stream create_stream() = 0;
  virtual void destroy_stream(Stream s) noexcept = 0;

  /// Enqueues a copy of `bytes` bytes on `s` (any direction: host, pinned, device).
  virtual void copy_async(void* dst, const void* src, std::size_t bytes, Stream s) = 0;
  /// Enqueues zeroing `bytes` bytes of device (or pinned) memory on `s`.
  virtual void zero_async(void* dst, std::size_t bytes, Stream s) = 0;
  /// Enqueues fn(arg) on `s`: it runs once everything enqueued before it has run, on a
  /// runtime thread, and must not call the runtime (CUDA forbids CUDA calls there).
  virtual void launch_host(Stream s, void (*fn)(void*), void* arg) = 0;
  /// Enqueues a wait: work enqueued on `s` after it runs only once *word has reached
  /// `value`, compared cyclically: (int32_t)(*word - value) >= 0 (CU_STREAM_WAIT_VALUE_GEQ),
  /// so a word that counts up passes every wait for a value it has reached, and an abort
  /// value far ahead releases every wait. `word` lies in pinned memory; the host sets it
  /// with signal(), a stream with write_value(). The wait holds its stream and, as on a
  /// GPU, the hardware queue the stream is mapped to (hw_queues()): enqueue it only behind
  /// work that cannot depend on what sets the word.
  virtual void wait_value(Stream s, std::uint32_t* word, std::uint32_t value) = 0;
  /// Enqueues *word = value (release order, after the work enqueued on `s` before it):
  /// cuStreamWriteValue32. `word` lies in pinned memory; the host reads it with acquire
  /// loads, and other streams may wait on it.
  virtual void write_value(Stream s, std::uint32_t* word, std::uint32_t value) = 0;
  /// Sets *word = value (release order) so that wait_value() waiters may go on.
  virtual void signal(std::uint32_t* word, std::uint32_t value) noexcept = 0;
  /// Events (cudaEventCreateWithFlags(cudaEventDisableTiming)): record_event captures the
  /// work enqueued on `s` so far; wait_event makes work enqueued on `s` afterwards wait for
  /// the last capture recorded before the call (none recorded: no wait).
  virtual Event create_event() = 0;
  virtual void destroy_event(Event e) noexcept = 0;
  virtual void record_event(Event e, Stream s) = 0;
  virtual void wait_event(Stream s, Event e) = 0;
  /// How many hardware queues of a device streams share (CUDA_DEVICE_MAX_CONNECTIONS, 8
  /// by default; emulated: BRAID_EMU_HW_QUEUES). A stream wait blocks everything behind it
  /// in its queue, so ranks that are threads of one process on one device can only wait
  /// for each other if their streams do not share a queue.
  virtual int hw_queues() const noexcept = 0;
  /// Enqueues fn(arg) as a kernel on `s` (counted as a launch): the emulated backend runs
  /// it on the stream's executor, in stream order, as its stand-in for a device kernel
  /// (braid's host kernels); the CUDA backend refuses it (kernels are launched through
  /// src/kernels/cuda). fn must not call the runtime.
  virtual void launch_emulated_kernel(Stream s, void (*fn)(void*), void* arg) = 0;
  /// Loads every kernel of braid's kernel modules (register_kernel_module) into `device`'s
  /// context now, once per device per process; later calls return at once. CUDA loads a
  /// kernel lazily at its first launch (CUDA_MODULE_LOADING=LAZY, the default since 12.2),
  /// and a load waits for the whole device: a first launch behind a stream that waits for
  /// something the host does only after the call returns (the caller's own gate, a peer
  /// rank's thread in the same process, a recv ahead on the stream) never returns. The
  /// communicator calls it before its ranks meet, when nothing of braid is in flight on the
  /// device, as NCCL loads its kernels at init. The emulation models the lazy load
  /// (BRAID_EMU_LAZY_LOADING).
  virtual void load_kernels(int device) = 0;
  /// Blocks until everything enqueued on `s` has run.
  virtual void synchronize(Stream s) = 0;
  /// Synchronous copy of `bytes` bytes, any direction: complete when it returns, so work
  /// enqueued afterwards on any stream sees it.
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  /// Sets the calling thread's stream-capture mode (cudaThreadExchangeStreamCaptureMode;
  /// kCaptureGlobal, kCaptureThreadLocal or kCaptureRelaxed) and returns the one it had.
  /// A thread in global mode (the default) may not allocate, free or synchronise while any
  /// thread captures a stream in global mode: the call fails and invalidates that capture.
  /// braid makes its own such calls relaxed (RelaxedCapture), as NCCL does, so that they
  /// never break a capture that the application runs on another thread. Not counted as a
  /// runtime call: it changes only the thread's own state.
  virtual int exchange_capture_mode(int mode) noexcept = 0;
  /// Stream capture, for tests of the refusal (cudaStreamBeginCapture / EndCapture).
  virtual void begin_capture(Stream s) = 0;
  virtual void end_capture(Stream s) = 0;

  /// "" when export_dmabuf() can work for memory of `device`, else why not (the driver, the
  /// device or the kernel lacks dma-buf; no device at all). Never throws.
  virtual std::string dmabuf_support(int device) = 0;
  /// A dma-buf file descriptor for device memory holding [p, p+bytes), for an RDMA
  /// NIC to register (ibv_reg_dmabuf_mr: GPUDirect RDMA without nvidia-peermem). The fd
  /// covers [*base, *base + *size), a page-aligned range holding [p, p+bytes) (CUDA: that
  /// range rounded out to the host page, cuMemGetHandleForAddressRange with
  /// CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD; emulated: the whole allocation); offset 0 of the
  /// fd is *base. The caller owns
  /// the fd (close it after registering). Throws Error(Unsupported) naming why (see
  /// dmabuf_support), Error(InvalidUsage) when the range is not device memory of one allocation.
  virtual int export_dmabuf(const void* p, std::size_t bytes, std::uintptr_t* base, std::size_t* size) = 0;
  /// Makes the NIC writes into memory of `device` whose completions the host has seen
  /// visible to device work enqueued after this call (CUDA: cuFlushGPUDirectRDMAWrites on
  /// that device's primary context, to owner; NCCL's flush has the same role); the calling
  /// thread's current device is left as it was. Throws Error(Cuda) on failure, and
  /// Error(Unsupported) where nothing can flush (no device; a driver without the entry point).
  virtual void flush_rdma_writes(int device) = 0;
  /// How many times flush_rdma_writes() has run in this process (tests check that a
  /// transport flushes before the device reads).
  virtual std::uint64_t rdma_flushes() const noexcept = 0;

  /// A handle for the whole device allocation that starts at `p` (a pointer alloc_device
  /// returned; InvalidUsage otherwise, naming it), for ipc_open in another process of this
  /// host. Throws Error(Unsupported) where the backend cannot (no device).
  virtual IpcHandle ipc_export(const void* p) = 0;
  /// Maps, in this process, the allocation of `bytes` bytes that another process exported;
  /// returns its device pointer here (on the exporter's device; peer access enabled where
  /// the devices differ, as cudaIpcMemLazyEnablePeerAccess). Takes over h.fd (closes it,
  /// mapped or not). Refuses a handle this process exported itself (CUDA cannot open those:
  /// ranks that are threads of one process use the pointer) with InvalidUsage, and a handle
  /// that is malformed or maps fewer than `bytes` bytes with InvalidUsage naming why.
  virtual void* ipc_open(IpcHandle h, std::size_t bytes) = 0;
  /// Unmaps what ipc_open returned. Never throws.
  virtual void ipc_close(void* p) noexcept = 0;

  /// The emulated backend's test hooks (null for the others): use emulation_hooks().
  virtual EmulationHooks* emulation() noexcept { return nullptr; }
};

/// Makes `device` current on the calling thread for its lifetime (nothing for device < 0)
/// and, with `restore`, puts the thread's own device back afterwards. Not restoring is for
/// a thread that keeps the device once set (an engine's): on CUDA 12 setting a device
/// makes its context, so "restoring" device 0 would make GPU 0's in every process.
class ScopedDevice {
 public:
  ScopedDevice(Runtime& rt, int device, bool restore = true) : rt_(rt) {
    if (device < 0) return;
    const int had = rt_.current_device();
    if (had == device) return;
    rt_.set_device(device);
    if (restore) had_ = had;
  }
  ~ScopedDevice() {
    if (had_ < 0) return;
    try {
      rt_.set_device(had_);
    } catch (...) {
    }
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  Runtime& rt_;
  int had_ = -1;  ///< the device to put back; -1: none
};

/// The process's runtime. The first call picks the backend from `choice` ("auto": cuda
/// when this build has CUDA and a device is present, else none; "cuda", "emulated",
/// "none"); later calls return the same runtime whatever they pass. `options` configure the
/// backend (the first call's count). Throws InvalidUsage for "cuda" without a usable CUDA
/// device, naming the reason.
Runtime& runtime(const std::string& choice, const RuntimeOptions& options = {});

/// cudaStreamCaptureMode's values (Runtime::exchange_capture_mode).
constexpr int kCaptureGlobal = 0, kCaptureThreadLocal = 1, kCaptureRelaxed = 2;

/// The calling thread in relaxed capture mode for the scope's life (Runtime::
/// exchange_capture_mode): wrap braid's own allocations, frees and synchronisations.
class RelaxedCapture {
 public:
  explicit RelaxedCapture(Runtime& rt) noexcept : rt_(rt), before_(rt.exchange_capture_mode(kCaptureRelaxed)) {}
  ~RelaxedCapture() { rt_.exchange_capture_mode(before_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  Runtime& rt_;
  int before_;
};

/// Registers a CUDA kernel (its host stub's address) of one of braid's kernel modules, one
/// per translation unit, from a static initializer: Runtime::load_kernels loads every
/// kernel of each registered module. Never throws.
void register_kernel_module(const void* kernel) noexcept;
/// The registered kernels, in registration order.
std::vector<const void*> kernel_modules();

/// A PCI address as sysfs names the device ("0000:1b:00.0"): lower case, the domain with
/// at least 4 digits (CUDA and NVML write 8: "00000000:1B:00.0"; a domain beyond 16 bits,
/// as VMD makes, keeps its digits: "10000:01:00.0").
std::string sysfs_pci_address(const std::string& address);

/// The emulated backend (the library reaches it through runtime("emulated"); tests may
/// make their own, with the options they test).
std::unique_ptr<Runtime> make_emulated(const EmulationOptions& options = {});
/// The CUDA backend, or null with *why set (not built with CUDA, no driver, no device).
/// `max_connections`: what hw_queues() reports (RuntimeOptions::cuda_max_connections).
std::unique_ptr<Runtime> make_cuda(std::string* why, bool* unusable_gpu = nullptr, int max_connections = 8);
/// The backend with no device; `why` is what describe() reports.
std::unique_ptr<Runtime> make_none(std::string why);

}  // namespace braid::gpu
