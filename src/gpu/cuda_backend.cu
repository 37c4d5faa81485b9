// The CUDA device backend: the CUDA runtime, linked statically (it dlopens libcuda.so
// itself, so libbraid.so keeps no NEEDED entry on a CUDA library and loads on hosts
// without a driver). The stream wait on a host word is cuStreamWaitValue32, a driver
// entry point obtained at run time through the runtime (as NCCL's cudawrap); where the
// driver refuses stream memory operations, a one-thread kernel waits on the word instead
// (UCC's fallback): it sleeps between reads and waits on the host, never on a peer GPU.
// GPUDirect RDMA takes four more driver entry points, obtained the same way: the dma-buf
// export of an allocation (cuMemGetAddressRange, cuMemGetHandleForAddressRange; CUDA 11.7+
// drivers), whether the device can export one (cuDeviceGetAttribute) and the flush of NIC
// writes (cuFlushGPUDirectRDMAWrites; CUDA 11.3+). Missing ones only make those refused.
//
// Not yet run on a GPU in this project's CI (no GPU there): scripts/gpu_check.sh runs
// the device tests against this backend on a machine with one (docs/gpu.md).
#include "gpu/runtime.hpp"

#include "base/check.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <unistd.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>

namespace braid::gpu {

namespace {

std::string cuda_text(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear the runtime's last-error slot (sticky errors stay sticky)
  throw Error(ErrorCode::Cuda, std::string(what) + " failed: " + cuda_text(e));
}

__global__ void wait_word_kernel(const volatile std::uint32_t* word, std::uint32_t value) {
  while (*word != value) __nanosleep(2000);
}

using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

/// A driver entry point as of CUDA 12.0's ABI (the version the runtime's own calls use),
/// or null where this driver lacks it. Never throws.
template <typename Fn>
Fn driver_entry_point(const char* name) {
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  void* fn = nullptr;
  const bool ok = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
                  q == cudaDriverEntryPointSuccess;
  cudaGetLastError();
  return ok ? reinterpret_cast<Fn>(fn) : nullptr;
}

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
  explicit Cuda(int devices) : devices_(devices) {
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    void* fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      wait_value_.store(reinterpret_cast<WaitValue32>(fn));
    cudaGetLastError();
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
           ", stream waits by " + (wait_value_.load() ? "cuStreamWaitValue32" : "a wait kernel");
  }
  int device_count() const noexcept override { return devices_; }
  int current_device() override {
    int d = 0;
    check(cudaGetDevice(&d), "cudaGetDevice");
    return d;
  }
  void set_device(int device) override { check(cudaSetDevice(device), "cudaSetDevice"); }
  PointerInfo classify(const void* p) override {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();  // unregistered host memory on old drivers
      return {};
    }
    if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) return {MemoryKind::device, a.device};
    return {};
  }
  std::string pci_bus_id(int device) override {
    char id[32] = {};
    if (cudaDeviceGetPCIBusId(id, sizeof id, device) != cudaSuccess) {
      cudaGetLastError();
      return "";
    }
    return sysfs_pci_address(id);  // as sysfs names the device
  }
  bool can_access_peer(int device, int peer) override {
    int ok = 0;
    if (device == peer || cudaDeviceCanAccessPeer(&ok, device, peer) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return ok != 0;
  }
  bool capturing(Stream s) override {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(static_cast<cudaStream_t>(s), &st), "cudaStreamIsCapturing");
    return st != cudaStreamCaptureStatusNone;
  }
  void* alloc_device(std::size_t bytes, int device) override {
    int old = current_device();
    if (old != device) set_device(device);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
    if (old != device) cudaSetDevice(old);
    check(e, ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
    return p;
  }
  void free_device(void* p) noexcept override {
    if (p) cudaFree(p);
  }
  void* alloc_pinned(std::size_t bytes) override {
    void* p = nullptr;
    check(cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable | cudaHostAllocMapped),
          ("cudaHostAlloc of " + std::to_string(bytes) + " bytes").c_str());
    return p;
  }
  void free_pinned(void* p) noexcept override {
    if (p) cudaFreeHost(p);
  }
  Stream create_stream() override {
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }
  void destroy_stream(Stream s) noexcept override {
    if (s) cudaStreamDestroy(static_cast<cudaStream_t>(s));
  }
  void copy_async(void* dst, const void* src, std::size_t bytes, Stream s) override {
    if (bytes == 0) return;
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(s)), "cudaMemcpyAsync");
  }
  void launch_host(Stream s, void (*fn)(void*), void* arg) override {
    check(cudaLaunchHostFunc(static_cast<cudaStream_t>(s), fn, arg), "cudaLaunchHostFunc");
  }
  void wait_value(Stream s, std::uint32_t* word, std::uint32_t value) override {
    void* dev = nullptr;
    check(cudaHostGetDevicePointer(&dev, word, 0), "cudaHostGetDevicePointer");
    if (const WaitValue32 wait = wait_value_.load()) {
      const CUresult r = wait(static_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(dev), value,
                                     CU_STREAM_WAIT_VALUE_EQ);
      if (r == CUDA_SUCCESS) return;
      // Stream memory operations off in this driver: fall back to the kernel for good.
      wait_value_.store(nullptr);
    }
    wait_word_kernel<<<1, 1, 0, static_cast<cudaStream_t>(s)>>>(static_cast<const std::uint32_t*>(dev), value);
    check(cudaGetLastError(), "launching the stream wait kernel");
  }
  void signal(std::uint32_t* word, std::uint32_t value) noexcept override {
    __atomic_store_n(word, value, __ATOMIC_RELEASE);
  }
  void synchronize(Stream s) override {
    check(cudaStreamSynchronize(static_cast<cudaStream_t>(s)), "cudaStreamSynchronize");
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
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
  void begin_capture(Stream s) override {
    check(cudaStreamBeginCapture(static_cast<cudaStream_t>(s), cudaStreamCaptureModeRelaxed),
          "cudaStreamBeginCapture");
  }
  void end_capture(Stream s) override {
    cudaGraph_t g = nullptr;
    check(cudaStreamEndCapture(static_cast<cudaStream_t>(s), &g), "cudaStreamEndCapture");
    if (g) cudaGraphDestroy(g);
  }

  std::string dmabuf_support(int device) override {
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
    const PointerInfo info = classify(p);
    BRAID_CHECK(info.kind == MemoryKind::device, InvalidUsage,
                "export_dmabuf: " << p << " is not device memory (host memory registers with ibv_reg_mr)");
    const std::string why = dmabuf_support(info.device);
    BRAID_CHECK(why.empty(), Unsupported,
                "export_dmabuf: no dma-buf for device memory of GPU " << info.device << ": " << why
                    << " (GPUDirect RDMA then needs nvidia-peermem, or staging through host memory)");
    // The driver calls act on the current context: the allocation's device's, as alloc_device.
    const int old = current_device();
    if (old != info.device) set_device(info.device);
    CUdeviceptr alloc_base = 0;
    std::size_t alloc_size = 0;
    const char* failed = nullptr;
    bool inside = false;
    int fd = -1;
    std::uintptr_t lo = 0, hi = 0;
    CUresult r = rdma_.get_address_range(&alloc_base, &alloc_size, reinterpret_cast<CUdeviceptr>(p));
    if (r != CUDA_SUCCESS) {
      failed = "cuMemGetAddressRange";
    } else {
      // The driver takes a range aligned to the host page, and an RDMA registration is
      // page-aligned too: [p, p+bytes) may reach to the end of the allocation's last page. A
      // small cudaMalloc allocation may share its pages with others: the fd then covers some
      // of theirs too, which the caller's registration of [p, p+bytes) never hands to a peer.
      const auto page = static_cast<std::uintptr_t>(::getpagesize());
      lo = static_cast<std::uintptr_t>(alloc_base) / page * page;
      hi = (static_cast<std::uintptr_t>(alloc_base) + alloc_size + page - 1) / page * page;
      inside = reinterpret_cast<std::uintptr_t>(p) >= lo && bytes <= hi - reinterpret_cast<std::uintptr_t>(p);
    }
    if (failed == nullptr && inside) {
      r = rdma_.get_handle_for_address_range(&fd, static_cast<CUdeviceptr>(lo), hi - lo,
                                             CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
      if (r != CUDA_SUCCESS) failed = "cuMemGetHandleForAddressRange";
    }
    if (old != info.device) cudaSetDevice(old);
    BRAID_CHECK(failed == nullptr, Cuda,
                "export_dmabuf: " << failed << " of " << p << " (GPU " << info.device
                                  << ") failed: " << driver_text(r));
    BRAID_CHECK(inside, InvalidUsage,
                "export_dmabuf: [" << p << ", +" << bytes << ") runs past the end of its device allocation ("
                                   << reinterpret_cast<void*>(alloc_base) << ", " << alloc_size
                                   << " bytes); a dma-buf covers one allocation, so register a range inside one");
    if (base) *base = lo;
    if (size) *size = hi - lo;
    return fd;
  }
  void flush_rdma_writes() override {
    const auto flush = rdma_.flush_rdma_writes;
    BRAID_CHECK(flush != nullptr, Unsupported,
                "the CUDA driver does not export cuFlushGPUDirectRDMAWrites (CUDA 11.3+ driver needed), so NIC "
                "writes into device memory cannot be made visible to the GPU: use a newer driver or stage "
                "through host memory");
    // The flush acts on the calling thread's current context, which a thread that never
    // made a CUDA runtime call may not have: bind the current device's primary context.
    set_device(current_device());
    const CUresult r =
        flush(CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX, CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER);
    if (r != CUDA_SUCCESS) throw Error(ErrorCode::Cuda, "cuFlushGPUDirectRDMAWrites failed: " + driver_text(r));
    flushes_.fetch_add(1, std::memory_order_relaxed);
  }
  std::uint64_t rdma_flushes() const noexcept override { return flushes_.load(std::memory_order_relaxed); }

 private:
  /// A driver result as "CUDA_ERROR_NOT_SUPPORTED (801)" (the number alone where the driver
  /// cannot name it).
  std::string driver_text(CUresult r) const {
    const char* name = nullptr;
    if (rdma_.get_error_name && rdma_.get_error_name(r, &name) == CUDA_SUCCESS && name)
      return std::string(name) + " (" + std::to_string(static_cast<int>(r)) + ")";
    return "CUresult " + std::to_string(static_cast<int>(r));
  }
  /// The calling thread's current device's stream for copy(), created on first use and
  /// kept for the life of the process.
  cudaStream_t copy_stream() {
    const int d = current_device();
    std::lock_guard<std::mutex> lock(copy_mu_);
    auto& s = copy_streams_[d];
    if (!s) check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags (copy stream)");
    return s;
  }

  std::mutex copy_mu_;
  std::map<int, cudaStream_t> copy_streams_;
  int devices_ = 0;
  int driver_ = 0;
  std::string name_ = "unknown";
  std::atomic<WaitValue32> wait_value_{nullptr};
  RdmaEntryPoints rdma_;  ///< set once by the constructor
  std::atomic<std::uint64_t> flushes_{0};
};

}  // namespace

std::unique_ptr<Runtime> make_cuda(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError();
    if (why)
      *why = e == cudaSuccess ? "the CUDA driver reports no devices"
                              : "no usable CUDA device (" + cuda_text(e) + ")";
    return nullptr;
  }
  return std::make_unique<Cuda>(n);
}

}  // namespace braid::gpu
