// The CUDA device backend: the CUDA runtime, linked statically (it dlopens libcuda.so
// itself, so libbraid.so keeps no NEEDED entry on a CUDA library and loads on hosts
// without a driver). The stream wait on a host word is cuStreamWaitValue32, a driver
// entry point obtained at run time through the runtime (as NCCL's cudawrap), and so is the
// stream write of a word (cuStreamWriteValue32); where the driver refuses stream memory
// operations, one-thread kernels wait on the word (UCC's fallback: it sleeps between reads)
// and store it instead. Events are created with timing off (cudaEventDisableTiming), as
// NCCL's and PyTorch's stream joins. Every method that is a driver call counts itself
// (Counts in runtime.hpp) on entry; internal calls between methods go through private
// helpers, so that one method call counts once.
// GPUDirect RDMA takes four more driver entry points, obtained the same way: the dma-buf
// export of an allocation (cuMemGetAddressRange, cuMemGetHandleForAddressRange; CUDA 11.7+
// drivers), whether the device can export one (cuDeviceGetAttribute) and the flush of NIC
// writes (cuFlushGPUDirectRDMAWrites; CUDA 11.3+). Missing ones only make those refused.
// Device memory shared with another process of the host is legacy CUDA IPC, as NCCL's p2p
// transport: cudaIpcGetMemHandle / cudaIpcOpenMemHandle / cudaIpcCloseMemHandle (runtime
// API), with cuMemGetAddressRange to check that a pointer is an allocation's start and that
// an opened allocation holds what the peer asked for.
//
// Not yet run on a GPU in this project's CI (no GPU there): scripts/gpu_check.sh runs
// the device tests against this backend on a machine with one (docs/gpu.md).
#include "gpu/runtime.hpp"

#include "base/check.hpp"
#include "base/logging.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace braid::gpu {

namespace {

std::string cuda_text(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear the runtime's last-error slot (sticky errors stay sticky)
  throw Error(ErrorCode::Cuda, std::string(what) + " failed: " + cuda_text(e));
}

/// The fallback of wait_value: spins, sleeping between reads, until the word has reached
/// `value` in the cyclic order of CU_STREAM_WAIT_VALUE_GEQ.
__global__ void wait_word_kernel(const volatile std::uint32_t* word, std::uint32_t value) {
  while (static_cast<std::int32_t>(*word - value) < 0) __nanosleep(2000);
  __threadfence_system();  // acquire: what the writer stored before the word is seen after
}

/// The fallback of write_value: the fence makes the work before it (stream order puts every
/// earlier operation of the stream before this kernel) visible system-wide first, so the
/// store is a release as cuStreamWriteValue32's default flush makes it.
__global__ void write_word_kernel(volatile std::uint32_t* word, std::uint32_t value) {
  __threadfence_system();
  *word = value;
}

/// This module's kernels load with the others' (Runtime::load_kernels).
const bool registered = (register_kernel_module(reinterpret_cast<const void*>(&wait_word_kernel)), true);

/// cuStreamWaitValue32 and cuStreamWriteValue32 have this one signature.
using StreamValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

/// Counts a runtime call (Counts): the first statement of every method that is a driver call.
#define COUNT_API() ::braid::gpu::detail::count_api()

/// A driver entry point as of CUDA 12.0's ABI (the version the runtime's own calls use),
/// or of `version` for one that is newer than 12.0 (asked for at 12.0, the driver answers
/// that it has no such symbol: seen on the H200 for CUDA 12.4's cuFuncLoad), or null where
/// this driver lacks it. Never throws.
template <typename Fn>
Fn driver_entry_point(const char* name, int version = 12000) {
  void* fn = nullptr;
#if CUDART_VERSION >= 12050
  // cudaGetDriverEntryPointByVersion is CUDA 12.5's.
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  const bool ok = cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &q) == cudaSuccess &&
                  q == cudaDriverEntryPointSuccess;
  cudaGetLastError();
#else
  // Before 12.5 the runtime's query asks at the runtime's own version (CUDART_VERSION), so a
  // 12.0-12.3 build would find no 12.4 symbol even on a newer driver. The driver's
  // cuGetProcAddress (12.0's form), which the runtime hands out, takes the version, as
  // NCCL's cudawrap calls it (scripts/cuda12_check.sh compiles this branch).
  static const PFN_cuGetProcAddress_v12000 get_proc = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult r = cudaDriverEntryPointSymbolNotFound;
    const bool got = cudaGetDriverEntryPoint("cuGetProcAddress", &p, cudaEnableDefault, &r) == cudaSuccess &&
                     r == cudaDriverEntryPointSuccess;
    cudaGetLastError();
    return got ? reinterpret_cast<PFN_cuGetProcAddress_v12000>(p) : nullptr;
  }();
  CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const bool ok = get_proc != nullptr && get_proc(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &q) == CUDA_SUCCESS &&
                  q == CU_GET_PROC_ADDRESS_SUCCESS;
#endif
  return ok ? reinterpret_cast<Fn>(fn) : nullptr;
}

/// CUDA 12.4's module entry points, typed here so that a build with an older toolkit (whose
/// cudaTypedefs.h lacks PFN_*_v12040) still loads kernels where the driver has them.
using FuncGetModule = CUresult (*)(CUmodule*, CUfunction);
using ModuleGetFunctionCount = CUresult (*)(unsigned int*, CUmodule);
using ModuleEnumerateFunctions = CUresult (*)(CUfunction*, unsigned int, CUmodule);
using FuncLoad = CUresult (*)(CUfunction);

/// The driver entry points of GPUDirect RDMA (null: absent from this driver).
struct RdmaEntryPoints {
  PFN_cuMemGetAddressRange_v3020 get_address_range = nullptr;
  PFN_cuMemGetHandleForAddressRange_v11070 get_handle_for_address_range = nullptr;
  PFN_cuFlushGPUDirectRDMAWrites_v11030 flush_rdma_writes = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
};

class Cuda final : public Runtime {
 public:
  Cuda(int devices, int max_connections) : devices_(devices), max_connections_(max_connections) {
    wait_value_.store(driver_entry_point<StreamValue32>("cuStreamWaitValue32"));
    write_value_.store(driver_entry_point<StreamValue32>("cuStreamWriteValue32"));
    // At 12.0's ABI "cuMemGetAddressRange" is cuMemGetAddressRange_v2 (64-bit sizes).
    rdma_.get_address_range = driver_entry_point<PFN_cuMemGetAddressRange_v3020>("cuMemGetAddressRange");
    rdma_.get_handle_for_address_range =
        driver_entry_point<PFN_cuMemGetHandleForAddressRange_v11070>("cuMemGetHandleForAddressRange");
    rdma_.flush_rdma_writes = driver_entry_point<PFN_cuFlushGPUDirectRDMAWrites_v11030>("cuFlushGPUDirectRDMAWrites");
    rdma_.device_get_attribute = driver_entry_point<PFN_cuDeviceGetAttribute_v2000>("cuDeviceGetAttribute");
    rdma_.get_error_name = driver_entry_point<PFN_cuGetErrorName_v6000>("cuGetErrorName");
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) name_ = prop.name;
    cudaGetLastError();
    int driver = 0;
    cudaDriverGetVersion(&driver);
    driver_ = driver;
  }
  Backend backend() const noexcept override { return Backend::cuda; }
  std::string describe() const override {
    return "cuda: " + std::to_string(devices_) + (devices_ == 1 ? " device" : " devices") + " (" + name_ +
           "), driver " + std::to_string(driver_ / 1000) + "." + std::to_string(driver_ % 1000 / 10) +
           ", stream waits by " + (wait_value_.load() ? "cuStreamWaitValue32" : "a wait kernel") + ", writes by " +
           (write_value_.load() ? "cuStreamWriteValue32" : "a write kernel") + ", " +
           std::to_string(max_connections_) + " hardware queues per GPU";
  }
  int device_count() const noexcept override { return devices_; }
  int current_device() override {
    COUNT_API();
    return device_now();
  }
  void set_device(int device) override {
    COUNT_API();
    make_current(device);
  }
  PointerInfo classify(const void* p) override {
    COUNT_API();
    return classify_now(p);
  }
  PointerInfo classify_now(const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();  // unregistered host memory on old drivers
      return {};
    }
    if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) return {MemoryKind::device, a.device};
    return {};
  }
  std::string pci_bus_id(int device) override {
    COUNT_API();
    char id[32] = {};
    if (cudaDeviceGetPCIBusId(id, sizeof id, device) != cudaSuccess) {
      cudaGetLastError();
      return "";
    }
    return sysfs_pci_address(id);  // as sysfs names the device
  }
  bool can_access_peer(int device, int peer) override {
    COUNT_API();
    int ok = 0;
    if (device == peer || cudaDeviceCanAccessPeer(&ok, device, peer) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return ok != 0;
  }
  bool capturing(Stream s) override {
    COUNT_API();
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(static_cast<cudaStream_t>(s), &st), "cudaStreamIsCapturing");
    return st != cudaStreamCaptureStatusNone;
  }
  void* alloc_device(std::size_t bytes, int device) override {
    COUNT_API();
    int old = device_now();
    if (old != device) make_current(device);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
    if (old != device) cudaSetDevice(old);
    check(e, ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
    return p;
  }
  void free_device(void* p) noexcept override {
    COUNT_API();
    detail::count(detail::Kind::sync);  // cudaFree waits for the device
    if (p) cudaFree(p);
  }
  void* alloc_pinned(std::size_t bytes) override {
    COUNT_API();
    void* p = nullptr;
    check(cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable | cudaHostAllocMapped),
          ("cudaHostAlloc of " + std::to_string(bytes) + " bytes").c_str());
    return p;
  }
  void free_pinned(void* p) noexcept override {
    COUNT_API();
    if (p) cudaFreeHost(p);
  }
  Stream create_stream() override {
    COUNT_API();
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }
  void destroy_stream(Stream s) noexcept override {
    COUNT_API();
    if (s) cudaStreamDestroy(static_cast<cudaStream_t>(s));
  }
  void copy_async(void* dst, const void* src, std::size_t bytes, Stream s) override {
    COUNT_API();
    if (bytes == 0) return;
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(s)), "cudaMemcpyAsync");
  }
  void zero_async(void* dst, std::size_t bytes, Stream s) override {
    COUNT_API();
    if (bytes == 0) return;
    check(cudaMemsetAsync(dst, 0, bytes, static_cast<cudaStream_t>(s)), "cudaMemsetAsync");
  }
  void launch_host(Stream s, void (*fn)(void*), void* arg) override {
    COUNT_API();
    detail::count(detail::Kind::hostfn);
    check(cudaLaunchHostFunc(static_cast<cudaStream_t>(s), fn, arg), "cudaLaunchHostFunc");
  }
  void wait_value(Stream s, std::uint32_t* word, std::uint32_t value) override {
    COUNT_API();
    detail::count(detail::Kind::memops);
    const CUdeviceptr dev = device_address(word);
    if (const StreamValue32 wait = wait_value_.load()) {
      const CUresult r = wait(static_cast<CUstream>(s), dev, value, CU_STREAM_WAIT_VALUE_GEQ);
      if (r == CUDA_SUCCESS) return;
      // Stream memory operations off in this driver: fall back to the kernel for good.
      wait_value_.store(nullptr);
    }
    wait_word_kernel<<<1, 1, 0, static_cast<cudaStream_t>(s)>>>(reinterpret_cast<const std::uint32_t*>(dev), value);
    check(cudaGetLastError(), "launching the stream wait kernel");
  }
  void write_value(Stream s, std::uint32_t* word, std::uint32_t value) override {
    COUNT_API();
    detail::count(detail::Kind::memops);
    const CUdeviceptr dev = device_address(word);
    if (const StreamValue32 write = write_value_.load()) {
      // The default flags flush the stream's earlier writes before the word: a release.
      const CUresult r = write(static_cast<CUstream>(s), dev, value, CU_STREAM_WRITE_VALUE_DEFAULT);
      if (r == CUDA_SUCCESS) return;
      write_value_.store(nullptr);  // as for waits: the kernel from here on
    }
    write_word_kernel<<<1, 1, 0, static_cast<cudaStream_t>(s)>>>(reinterpret_cast<std::uint32_t*>(dev), value);
    check(cudaGetLastError(), "launching the stream write kernel");
  }
  void signal(std::uint32_t* word, std::uint32_t value) noexcept override {
    __atomic_store_n(word, value, __ATOMIC_RELEASE);
  }
  Event create_event() override {
    COUNT_API();
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }
  void destroy_event(Event e) noexcept override {
    COUNT_API();
    if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
  void record_event(Event e, Stream s) override {
    COUNT_API();
    check(cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(s)), "cudaEventRecord");
  }
  void wait_event(Stream s, Event e) override {
    COUNT_API();
    check(cudaStreamWaitEvent(static_cast<cudaStream_t>(s), static_cast<cudaEvent_t>(e), 0), "cudaStreamWaitEvent");
  }
  int hw_queues() const noexcept override { return max_connections_; }
  void launch_emulated_kernel(Stream, void (*)(void*), void*) override {
    COUNT_API();
    throw Error(ErrorCode::Internal,
                "launch_emulated_kernel on the CUDA backend: host functions are the emulated runtime's stand-in "
                "for kernels; on a GPU launch braid's CUDA kernels (src/kernels/cuda)");
  }
  void load_kernels(int device) override {
    COUNT_API();
    std::lock_guard<std::mutex> lock(load_mu_);
    if (device < 0 || device >= devices_ || loaded_.count(device)) return;
    const int before = device_now();
    if (before != device) make_current(device);  // no switch (and no context) when it is current
    std::string why;
    std::size_t loaded = 0;
    for (const void* k : kernel_modules()) {
      try {
        loaded += load_module_of(k);
      } catch (const Error& e) {
        if (why.empty()) why = e.what();
      }
    }
    if (before != device) make_current(before);
    loaded_.insert(device);
    if (!why.empty())
      BRAID_LOG(warn, "CUDA device " << device << ": braid's kernels could not all be loaded up front (" << why
                                    << "); each loads at its first launch, which waits for the whole device "
                                       "and can deadlock behind a stream wait: set CUDA_MODULE_LOADING=EAGER");
    else
      BRAID_LOG(info, "CUDA device " << device << ": " << loaded << " kernels loaded");
  }
  void synchronize(Stream s) override {
    COUNT_API();
    detail::count(detail::Kind::sync);
    check(cudaStreamSynchronize(static_cast<cudaStream_t>(s)), "cudaStreamSynchronize");
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    COUNT_API();
    detail::count(detail::Kind::sync);
    if (bytes == 0) return;
    // Not cudaMemcpy: from pageable host memory it returns once the source is staged,
    // before the DMA has landed, and it runs on the legacy stream, which orders nothing
    // on the non-blocking streams braid and its users enqueue on. A device collective
    // issued right after it then staged stale data (seen on an H100: in-place all-reduce
    // results wrong after a refill). A copy on a private non-blocking stream, then a
    // synchronize of that stream, is complete when this returns. Never the whole device:
    // other ranks' streams on this GPU may be waiting on a collective.
    const cudaStream_t s = copy_stream();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync (synchronous copy)");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize (synchronous copy)");
  }
  int exchange_capture_mode(int mode) noexcept override {
    auto m = static_cast<cudaStreamCaptureMode>(mode);
    if (cudaThreadExchangeStreamCaptureMode(&m) != cudaSuccess) {
      cudaGetLastError();
      return mode;
    }
    return static_cast<int>(m);
  }
  void begin_capture(Stream s) override {
    COUNT_API();
    check(cudaStreamBeginCapture(static_cast<cudaStream_t>(s), cudaStreamCaptureModeRelaxed),
          "cudaStreamBeginCapture");
  }
  void end_capture(Stream s) override {
    COUNT_API();
    cudaGraph_t g = nullptr;
    check(cudaStreamEndCapture(static_cast<cudaStream_t>(s), &g), "cudaStreamEndCapture");
    if (g) cudaGraphDestroy(g);
  }

  std::string dmabuf_support(int device) override {
    COUNT_API();
    return dmabuf_why(device);
  }
  std::string dmabuf_why(int device) {
    if (device < 0 || device >= devices_)
      return "GPU " + std::to_string(device) + " does not exist (this process sees " + std::to_string(devices_) + ")";
    if (!rdma_.get_address_range)
      return "the driver does not export cuMemGetAddressRange at CUDA 12.0's ABI (CUDA 12.0+ driver needed)";
    if (!rdma_.get_handle_for_address_range)
      return "the driver does not export cuMemGetHandleForAddressRange (CUDA 11.7+ driver needed)";
    if (!rdma_.device_get_attribute) return "the driver does not export cuDeviceGetAttribute";
    int supported = 0;
    // The runtime's device ordinal is the driver's CUdevice (both count the devices
    // CUDA_VISIBLE_DEVICES leaves, in the same order); the runtime initialized the driver.
    const CUresult r = rdma_.device_get_attribute(&supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
                                                  static_cast<CUdevice>(device));
    if (r != CUDA_SUCCESS)
      return "cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED) of GPU " + std::to_string(device) +
             " failed: " + driver_text(r);
    if (supported != 1)
      return "GPU " + std::to_string(device) +
             " does not support dma-buf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0: an open kernel module and "
             "Linux 5.12+ are needed)";
    return "";
  }
  int export_dmabuf(const void* p, std::size_t bytes, std::uintptr_t* base, std::size_t* size) override {
    COUNT_API();
    const PointerInfo info = classify_now(p);
    BRAID_CHECK(info.kind == MemoryKind::device, InvalidUsage,
                "export_dmabuf: " << p << " is not device memory (host memory registers with ibv_reg_mr)");
    const std::string why = dmabuf_why(info.device);
    BRAID_CHECK(why.empty(), Unsupported,
                "export_dmabuf: no dma-buf for device memory of GPU " << info.device << ": " << why
                    << " (GPUDirect RDMA then needs nvidia-peermem, or staging through host memory)");
    // Exactly the range asked for, rounded out to the host page as the driver requires (as
    // NCCL's registration does): not the whole allocation, which for a caching allocator's
    // or an expandable segment's range would pin far more BAR space than needed, and whose
    // base a page-rounded start may not even lie in (small cudaMalloc allocations share
    // pages). The driver refuses a range that is not device memory it can export.
    const auto page = static_cast<std::uintptr_t>(::getpagesize());
    const std::uintptr_t lo = reinterpret_cast<std::uintptr_t>(p) / page * page;
    const std::uintptr_t hi = (reinterpret_cast<std::uintptr_t>(p) + std::max<std::size_t>(bytes, 1) + page - 1) / page * page;
    // The driver calls act on the current context: the memory's device's, as alloc_device.
    const int old = device_now();
    if (old != info.device) make_current(info.device);
    int fd = -1;
    const CUresult r = rdma_.get_handle_for_address_range(&fd, static_cast<CUdeviceptr>(lo), hi - lo,
                                                          CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (old != info.device) cudaSetDevice(old);
    BRAID_CHECK(r == CUDA_SUCCESS, Cuda,
                "export_dmabuf: cuMemGetHandleForAddressRange of [" << reinterpret_cast<void*>(lo) << ", +" << (hi - lo)
                                                                    << ") (GPU " << info.device << ") failed: "
                                                                    << driver_text(r));
    if (base) *base = lo;
    if (size) *size = hi - lo;
    return fd;
  }
  void flush_rdma_writes(int device) override {
    COUNT_API();
    const auto flush = rdma_.flush_rdma_writes;
    BRAID_CHECK(flush != nullptr, Unsupported,
                "the CUDA driver does not export cuFlushGPUDirectRDMAWrites (CUDA 11.3+ driver needed), so NIC "
                "writes into device memory cannot be made visible to the GPU: use a newer driver or stage "
                "through host memory");
    // The flush acts on the calling thread's current context: the device the NIC wrote
    // (the thread may be a user thread helping the engine, current on another GPU).
    const int old = device_now();
    if (old != device) make_current(device);
    const CUresult r =
        flush(CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX, CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER);
    if (old != device) cudaSetDevice(old);
    if (r != CUDA_SUCCESS) throw Error(ErrorCode::Cuda, "cuFlushGPUDirectRDMAWrites failed: " + driver_text(r));
    flushes_.fetch_add(1, std::memory_order_relaxed);
  }
  std::uint64_t rdma_flushes() const noexcept override { return flushes_.load(std::memory_order_relaxed); }

  // The handle's bytes: the 64 bytes of cudaIpcMemHandle_t, then the exporter's pid
  // (int64, little-endian), so that ipc_open can refuse this process's own handles (the
  // driver fails those with an unhelpful error).
  IpcHandle ipc_export(const void* p) override {
    COUNT_API();
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      a.type = cudaMemoryTypeUnregistered;
    }
    BRAID_CHECK(a.type == cudaMemoryTypeDevice, InvalidUsage,
                "ipc_export: " << p << " is not device memory of cudaMalloc ("
                               << (a.type == cudaMemoryTypeManaged ? "managed memory has no CUDA IPC handle"
                                                                   : "host memory is not shared this way")
                               << "): only what alloc_device returned can be mapped by another process");
    BRAID_CHECK(rdma_.get_address_range != nullptr, Unsupported,
                "ipc_export: the driver does not export cuMemGetAddressRange at CUDA 12.0's ABI (CUDA 12.0+ "
                "driver needed), so the allocation that holds "
                    << p << " cannot be checked");
    const int old = device_now();
    if (old != a.device) make_current(a.device);
    CUdeviceptr base = 0;
    std::size_t size = 0;
    const CUresult r = rdma_.get_address_range(&base, &size, reinterpret_cast<CUdeviceptr>(p));
    cudaIpcMemHandle_t handle{};
    cudaError_t e = cudaSuccess;
    const bool at_start = r == CUDA_SUCCESS && static_cast<std::uintptr_t>(base) == reinterpret_cast<std::uintptr_t>(p);
    if (at_start) e = cudaIpcGetMemHandle(&handle, const_cast<void*>(p));
    if (old != a.device) cudaSetDevice(old);
    BRAID_CHECK(r == CUDA_SUCCESS, Cuda,
                "ipc_export: cuMemGetAddressRange of " << p << " (GPU " << a.device << ") failed: " << driver_text(r));
    BRAID_CHECK(at_start, InvalidUsage,
                "ipc_export: " << p << " lies inside the device allocation at " << reinterpret_cast<void*>(base) << " ("
                               << size << " bytes), not at its start; a handle covers a whole allocation: export "
                               << "the pointer alloc_device returned and add the offset in the peer");
    check(e, "ipc_export: cudaIpcGetMemHandle");
    IpcHandle h;
    h.bytes.assign(sizeof handle + 8, '\0');
    std::memcpy(&h.bytes[0], &handle, sizeof handle);
    const auto pid = static_cast<std::uint64_t>(static_cast<std::int64_t>(::getpid()));
    for (int i = 0; i < 8; ++i) h.bytes[sizeof handle + i] = static_cast<char>((pid >> (8 * i)) & 0xff);
    return h;
  }
  void* ipc_open(IpcHandle h, std::size_t bytes) override {
    COUNT_API();
    if (h.fd >= 0) ::close(h.fd);  // taken over; a CUDA handle carries none
    cudaIpcMemHandle_t handle{};
    BRAID_CHECK(h.bytes.size() == sizeof handle + 8, InvalidUsage,
                "ipc_open: malformed handle (" << h.bytes.size() << " bytes; a CUDA handle is " << sizeof handle + 8
                                               << ": cudaIpcMemHandle_t and the exporter's pid)");
    std::memcpy(&handle, h.bytes.data(), sizeof handle);
    std::uint64_t pid = 0;
    for (int i = 0; i < 8; ++i)
      pid |= static_cast<std::uint64_t>(static_cast<unsigned char>(h.bytes[sizeof handle + i])) << (8 * i);
    BRAID_CHECK(static_cast<std::int64_t>(pid) != static_cast<std::int64_t>(::getpid()), InvalidUsage,
                "ipc_open: the handle was exported by this process (pid "
                    << static_cast<std::int64_t>(pid)
                    << "), which cannot open its own handles (CUDA refuses them): ranks that are threads of one "
                       "process use the pointer itself");
    const int device = device_now();
    void* p = nullptr;
    check(cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess),
          ("ipc_open: cudaIpcOpenMemHandle on GPU " + std::to_string(device)).c_str());
    if (rdma_.get_address_range) {
      CUdeviceptr base = 0;
      std::size_t size = 0;
      const CUresult r = rdma_.get_address_range(&base, &size, reinterpret_cast<CUdeviceptr>(p));
      if (r == CUDA_SUCCESS && size < bytes) {
        cudaIpcCloseMemHandle(p);
        cudaGetLastError();
        throw Error(ErrorCode::InvalidUsage, "ipc_open: the exported allocation holds " + std::to_string(size) +
                                                 " bytes, fewer than the " + std::to_string(bytes) + " asked for");
      }
    }
    std::lock_guard<std::mutex> lock(ipc_mu_);
    ipc_opened_[p] = device;
    return p;
  }
  void ipc_close(void* p) noexcept override {
    COUNT_API();
    int device = -1;
    {
      std::lock_guard<std::mutex> lock(ipc_mu_);
      auto it = ipc_opened_.find(p);
      if (it == ipc_opened_.end()) return;  // not what ipc_open returned: nothing to unmap
      device = it->second;
      ipc_opened_.erase(it);
    }
    // Closed in the context that opened it: the device current at ipc_open.
    int old = -1;
    if (cudaGetDevice(&old) != cudaSuccess) old = -1;
    if (old != device) cudaSetDevice(device);
    cudaIpcCloseMemHandle(p);
    if (old >= 0 && old != device) cudaSetDevice(old);
    cudaGetLastError();
  }

 private:
  /// A driver result as "CUDA_ERROR_NOT_SUPPORTED (801)" (the number alone where the driver
  /// cannot name it).
  std::string driver_text(CUresult r) const {
    const char* name = nullptr;
    if (rdma_.get_error_name && rdma_.get_error_name(r, &name) == CUDA_SUCCESS && name)
      return std::string(name) + " (" + std::to_string(static_cast<int>(r)) + ")";
    return "CUresult " + std::to_string(static_cast<int>(r));
  }
  int device_now() {
    int d = 0;
    check(cudaGetDevice(&d), "cudaGetDevice");
    return d;
  }
  void make_current(int device) { check(cudaSetDevice(device), "cudaSetDevice"); }
  /// Loads every function of the module that holds `kernel` into the current context
  /// (cuFuncLoad, CUDA 12.4's driver); returns how many. An older driver loads only
  /// `kernel` itself (cudaFuncGetAttributes loads what it inspects) and throws to say so.
  std::size_t load_module_of(const void* kernel) {
    cudaFuncAttributes attr{};
    check(cudaFuncGetAttributes(&attr, kernel), "cudaFuncGetAttributes");
    cudaFunction_t fn = nullptr;
    check(cudaGetFuncBySymbol(&fn, kernel), "cudaGetFuncBySymbol");
    static const auto get_module = driver_entry_point<FuncGetModule>("cuFuncGetModule");
    static const auto count = driver_entry_point<ModuleGetFunctionCount>("cuModuleGetFunctionCount", 12040);
    static const auto list = driver_entry_point<ModuleEnumerateFunctions>("cuModuleEnumerateFunctions", 12040);
    static const auto load = driver_entry_point<FuncLoad>("cuFuncLoad", 12040);
    BRAID_CHECK(get_module && count && list && load, Unsupported,
                "this CUDA driver has no cuModuleEnumerateFunctions/cuFuncLoad (CUDA 12.4)");
    CUmodule mod = nullptr;
    unsigned n = 0;
    BRAID_CHECK(get_module(&mod, reinterpret_cast<CUfunction>(fn)) == CUDA_SUCCESS &&
                    count(&n, mod) == CUDA_SUCCESS,
                Cuda, "cuFuncGetModule/cuModuleGetFunctionCount failed");
    std::vector<CUfunction> fns(n);
    BRAID_CHECK(n == 0 || list(fns.data(), n, mod) == CUDA_SUCCESS, Cuda, "cuModuleEnumerateFunctions failed");
    for (CUfunction f : fns) BRAID_CHECK(load(f) == CUDA_SUCCESS, Cuda, "cuFuncLoad failed");
    return n;
  }
  /// The address the device uses for a stream memory operation on `word`: the mapped
  /// pointer of pinned host memory, or the word itself where it is device memory (this
  /// GPU's, or a peer's mapped by CUDA IPC), which has no host mapping to look up.
  CUdeviceptr device_address(std::uint32_t* word) {
    void* dev = nullptr;
    if (cudaHostGetDevicePointer(&dev, word, 0) == cudaSuccess) return reinterpret_cast<CUdeviceptr>(dev);
    cudaGetLastError();
    const PointerInfo info = classify_now(word);
    BRAID_CHECK(info.kind == MemoryKind::device, InvalidUsage,
                "a stream memory operation on " << static_cast<void*>(word)
                                                << ", which is neither pinned host memory (alloc_pinned) nor "
                                                   "device memory");
    return reinterpret_cast<CUdeviceptr>(word);
  }
  /// The calling thread's current device's stream for copy(), created on first use and
  /// kept for the life of the process.
  cudaStream_t copy_stream() {
    const int d = device_now();
    std::lock_guard<std::mutex> lock(copy_mu_);
    auto& s = copy_streams_[d];
    if (!s) check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags (copy stream)");
    return s;
  }

  std::mutex ipc_mu_;
  std::map<void*, int> ipc_opened_;  ///< what ipc_open mapped, and the device current then
  std::mutex copy_mu_;
  std::map<int, cudaStream_t> copy_streams_;
  int devices_ = 0;
  int max_connections_ = 8;
  int driver_ = 0;
  std::string name_ = "unknown";
  std::atomic<StreamValue32> wait_value_{nullptr};
  std::mutex load_mu_;
  std::set<int> loaded_;  ///< devices whose context has braid's kernels loaded
  std::atomic<StreamValue32> write_value_{nullptr};
  RdmaEntryPoints rdma_;  ///< set once by the constructor
  std::atomic<std::uint64_t> flushes_{0};
};

}  // namespace

std::unique_ptr<Runtime> make_cuda(std::string* why, bool* unusable_gpu, int max_connections) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError();
    int driver = 0;
    cudaDriverGetVersion(&driver);  // 0 when no driver is installed
    cudaGetLastError();
    const auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
    std::string text;
    if (e == cudaSuccess) {
      text = "the CUDA driver reports no devices";
    } else if (driver == 0) {
      text = "no NVIDIA driver is installed (libcuda.so.1 not found)";
    } else if (e == cudaErrorInsufficientDriver || driver < CUDART_VERSION) {
      // A GPU this build cannot use: the driver floor of a build is its toolkit's.
      text = "the NVIDIA driver supports CUDA " + version(driver) + ", older than this build of braid needs (CUDA " +
             version(CUDART_VERSION) + "): update the driver, or build braid with a toolkit no newer than " +
             version(driver) + " (docs/python.md, \"Installing\")";
      if (unusable_gpu) *unusable_gpu = true;
    } else {
      text = "no usable CUDA device (" + cuda_text(e) + ", driver CUDA " + version(driver) + ")";
    }
    if (why) *why = text;
    return nullptr;
  }
  return std::make_unique<Cuda>(n, max_connections);
}

}  // namespace braid::gpu
