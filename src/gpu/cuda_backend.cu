// The CUDA device backend: the CUDA runtime, linked statically (it dlopens libcuda.so
// itself, so libbraid.so keeps no NEEDED entry on a CUDA library and loads on hosts
// without a driver). The stream wait on a host word is cuStreamWaitValue32, a driver
// entry point obtained at run time through the runtime (as NCCL's cudawrap); where the
// driver refuses stream memory operations, a one-thread kernel waits on the word instead
// (UCC's fallback): it sleeps between reads and waits on the host, never on a peer GPU.
//
// Not yet run on a GPU in this project's CI (no GPU there): scripts/gpu_check.sh runs
// the device tests against this backend on a machine with one (docs/gpu.md).
#include "gpu/runtime.hpp"

#include "base/check.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

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

class Cuda final : public Runtime {
 public:
  explicit Cuda(int devices) : devices_(devices) {
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    void* fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      wait_value_.store(reinterpret_cast<WaitValue32>(fn));
    cudaGetLastError();
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

 private:
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
