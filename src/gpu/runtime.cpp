// The process's device runtime: backend choice, and the backend without a device.
#include "gpu/runtime.hpp"

#include "base/check.hpp"
#include "base/logging.hpp"

#include <braid/config.hpp>

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <mutex>

namespace braid::gpu {

namespace {

/// The process's counts (Counts): relaxed atomics, since they are statistics read as
/// differences after the work, never to order anything. Constant-initialised, so a runtime
/// call from a static constructor counts too.
struct Counters {
  std::atomic<std::uint64_t> progress_api{0}, caller_api{0}, hostfn{0}, sync{0}, launch{0}, memops{0};
};
Counters g_counters;
thread_local bool t_progress_thread = false;

}  // namespace

Counts counts() noexcept {
  Counts c;
  c.progress_api = g_counters.progress_api.load(std::memory_order_relaxed);
  c.caller_api = g_counters.caller_api.load(std::memory_order_relaxed);
  c.hostfn = g_counters.hostfn.load(std::memory_order_relaxed);
  c.sync = g_counters.sync.load(std::memory_order_relaxed);
  c.launch = g_counters.launch.load(std::memory_order_relaxed);
  c.memops = g_counters.memops.load(std::memory_order_relaxed);
  return c;
}

void mark_progress_thread() noexcept { t_progress_thread = true; }

void count_launch() noexcept { g_counters.launch.fetch_add(1, std::memory_order_relaxed); }

namespace detail {
void count_api() noexcept {
  (t_progress_thread ? g_counters.progress_api : g_counters.caller_api).fetch_add(1, std::memory_order_relaxed);
}
void count(Kind k) noexcept {
  switch (k) {
    case Kind::hostfn: g_counters.hostfn.fetch_add(1, std::memory_order_relaxed); return;
    case Kind::sync: g_counters.sync.fetch_add(1, std::memory_order_relaxed); return;
    case Kind::memops: g_counters.memops.fetch_add(1, std::memory_order_relaxed); return;
  }
}
}  // namespace detail

EmulationHooks* emulation_hooks(Runtime& rt) noexcept { return rt.emulation(); }

const char* to_string(Backend b) noexcept {
  switch (b) {
    case Backend::none: return "none";
    case Backend::cuda: return "cuda";
    case Backend::emulated: return "emulated";
  }
  return "invalid";
}

std::string sysfs_pci_address(const std::string& address) {
  std::string s;
  s.reserve(address.size());
  for (char c : address) s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // "00000000:1b:00.0": CUDA and NVML write 8 domain digits; sysfs at least 4 ("%04x").
  const auto colon = s.find(':');
  std::size_t zeros = 0;
  while (colon != std::string::npos && colon - zeros > 4 && s[zeros] == '0') ++zeros;
  s.erase(0, zeros);
  return s;
}

namespace {

/// No device: every pointer is host memory; device operations are refused with the reason.
class NoDevice final : public Runtime {
 public:
  explicit NoDevice(std::string why) : why_(std::move(why)) {}
  Backend backend() const noexcept override { return Backend::none; }
  std::string describe() const override { return "none: " + why_; }
  int device_count() const noexcept override { return 0; }
  // Every runtime call counts (Counts), refused or not, as on the other backends.
  int current_device() override { refuse("current_device"); }
  void set_device(int) override { refuse("set_device"); }
  PointerInfo classify(const void*) override { return counted<PointerInfo>({}); }
  bool capturing(Stream) override { return counted(false); }
  std::string pci_bus_id(int) override { return counted(std::string()); }
  bool can_access_peer(int, int) override { return counted(false); }
  void* alloc_device(std::size_t, int) override { refuse("device memory"); }
  void free_device(void*) noexcept override {
    detail::count_api();
    detail::count(detail::Kind::sync);
  }
  void* alloc_pinned(std::size_t) override { refuse("pinned memory"); }
  void free_pinned(void*) noexcept override { detail::count_api(); }
  Stream create_stream() override { refuse("streams"); }
  void destroy_stream(Stream) noexcept override { detail::count_api(); }
  void copy_async(void*, const void*, std::size_t, Stream) override { refuse("copies"); }
  void zero_async(void*, std::size_t, Stream) override { refuse("memset"); }
  void launch_host(Stream, void (*)(void*), void*) override { refuse("stream callbacks"); }
  void wait_value(Stream, std::uint32_t*, std::uint32_t) override { refuse("stream waits"); }
  void write_value(Stream, std::uint32_t*, std::uint32_t) override { refuse("stream writes"); }
  void signal(std::uint32_t* word, std::uint32_t value) noexcept override {
    __atomic_store_n(word, value, __ATOMIC_RELEASE);
  }
  Event create_event() override { refuse("events"); }
  void destroy_event(Event) noexcept override { detail::count_api(); }
  void record_event(Event, Stream) override { refuse("events"); }
  void wait_event(Stream, Event) override { refuse("events"); }
  int hw_queues() const noexcept override { return 0; }
  void launch_emulated_kernel(Stream, void (*)(void*), void*) override { refuse("kernels"); }
  void load_kernels(int) override {}
  void synchronize(Stream) override {
    detail::count_api();
    detail::count(detail::Kind::sync);
  }
  void copy(void*, const void*, std::size_t) override { refuse("copies"); }
  int exchange_capture_mode(int mode) noexcept override { return mode; }
  void begin_capture(Stream) override { refuse("stream capture"); }
  void end_capture(Stream) override { refuse("stream capture"); }
  std::string dmabuf_support(int) override { return counted("no device runtime: " + why_); }
  int export_dmabuf(const void*, std::size_t, std::uintptr_t*, std::size_t*) override { refuse("dma-buf exports"); }
  // Refused like the other device operations rather than a silent no-op: with no device
  // memory there is nothing a NIC could have written, so a caller here is a bug to name.
  void flush_rdma_writes(int) override { refuse("GPUDirect RDMA flushes"); }
  std::uint64_t rdma_flushes() const noexcept override { return 0; }  // none ever runs
  IpcHandle ipc_export(const void*) override { refuse("CUDA IPC handles"); }
  void* ipc_open(IpcHandle h, std::size_t) override {
    if (h.fd >= 0) ::close(h.fd);  // taken over, mapped or not
    refuse("CUDA IPC handles");
  }
  void ipc_close(void*) noexcept override { detail::count_api(); }  // nothing was ever opened

 private:
  template <typename T>
  static T counted(T v) {
    detail::count_api();
    return v;
  }
  [[noreturn]] void refuse(const char* what) const {
    detail::count_api();
    throw Error(ErrorCode::Unsupported, std::string(what) + " need a GPU runtime, and this process has none: " + why_);
  }
  std::string why_;
};

}  // namespace

#if !BRAID_HAVE_CUDA
std::unique_ptr<Runtime> make_cuda(std::string* why, bool*, int) {
  if (why) *why = "this build of braid has no CUDA support (configure with BRAID_WITH_CUDA=ON)";
  return nullptr;
}
#endif

std::unique_ptr<Runtime> make_none(std::string why) { return std::make_unique<NoDevice>(std::move(why)); }

namespace {
struct KernelModules {
  std::mutex mu;
  std::vector<const void*> kernels;
};
KernelModules& kernel_registry() {
  static KernelModules* r = new KernelModules;  // never destroyed: registered from static initializers
  return *r;
}
}  // namespace

void register_kernel_module(const void* kernel) noexcept {
  KernelModules& r = kernel_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  try {
    r.kernels.push_back(kernel);
  } catch (...) {  // out of memory at load time: that module then loads lazily
  }
}

std::vector<const void*> kernel_modules() {
  KernelModules& r = kernel_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.kernels;
}

Runtime& runtime(const std::string& choice, const RuntimeOptions& options) {
  static std::once_flag once;
  static Runtime* chosen = nullptr;  // never destroyed: stream callbacks may outlive main
  std::call_once(once, [&] {
    std::unique_ptr<Runtime> r;
    std::string why;
    if (choice == "emulated") {
      r = make_emulated(options.emulation);
    } else if (choice == "none") {
      r = make_none("BRAID_GPU_BACKEND=none");
    } else {
      bool unusable_gpu = false;
      r = make_cuda(&why, &unusable_gpu, options.cuda_max_connections);
      // auto on a machine with a GPU this build cannot use: say so loudly (once), since its
      // device buffers will be refused rather than used.
      if (!r && unusable_gpu && choice != "cuda")
        BRAID_LOG(warn, "device runtime: " << why << "; device buffers will be refused until then");
      if (!r && choice == "cuda")
        throw Error(ErrorCode::InvalidUsage, "BRAID_GPU_BACKEND=cuda, but there is no usable CUDA device: " + why +
                                                 " (use auto to run on host memory only)");
      if (!r) r = make_none(why);
    }
    chosen = r.release();
  });
  BRAID_CHECK(chosen != nullptr, Internal, "the device runtime failed to start earlier");
  return *chosen;
}

}  // namespace braid::gpu
