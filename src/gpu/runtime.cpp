// The process's device runtime: backend choice, and the backend without a device.
#include "gpu/runtime.hpp"

#include "base/check.hpp"
#include "base/logging.hpp"

#include <braid/config.hpp>

#include <unistd.h>

#include <cctype>
#include <mutex>

namespace braid::gpu {

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
  int current_device() override { refuse("current_device"); }
  void set_device(int) override { refuse("set_device"); }
  PointerInfo classify(const void*) override { return {}; }
  bool capturing(Stream) override { return false; }
  std::string pci_bus_id(int) override { return ""; }
  bool can_access_peer(int, int) override { return false; }
  void* alloc_device(std::size_t, int) override { refuse("device memory"); }
  void free_device(void*) noexcept override {}
  void* alloc_pinned(std::size_t) override { refuse("pinned memory"); }
  void free_pinned(void*) noexcept override {}
  Stream create_stream() override { refuse("streams"); }
  void destroy_stream(Stream) noexcept override {}
  void copy_async(void*, const void*, std::size_t, Stream) override { refuse("copies"); }
  void zero_async(void*, std::size_t, Stream) override { refuse("memset"); }
  void launch_host(Stream, void (*)(void*), void*) override { refuse("stream callbacks"); }
  void wait_value(Stream, std::uint32_t*, std::uint32_t) override { refuse("stream waits"); }
  void signal(std::uint32_t* word, std::uint32_t value) noexcept override {
    __atomic_store_n(word, value, __ATOMIC_RELEASE);
  }
  void synchronize(Stream) override {}
  void copy(void*, const void*, std::size_t) override { refuse("copies"); }
  void begin_capture(Stream) override { refuse("stream capture"); }
  void end_capture(Stream) override { refuse("stream capture"); }
  std::string dmabuf_support(int) override { return "no device runtime: " + why_; }
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
  void ipc_close(void*) noexcept override {}  // nothing was ever opened

 private:
  [[noreturn]] void refuse(const char* what) const {
    throw Error(ErrorCode::Unsupported, std::string(what) + " need a GPU runtime, and this process has none: " + why_);
  }
  std::string why_;
};

}  // namespace

#if !BRAID_HAVE_CUDA
std::unique_ptr<Runtime> make_cuda(std::string* why, bool*) {
  if (why) *why = "this build of braid has no CUDA support (configure with BRAID_WITH_CUDA=ON)";
  return nullptr;
}
#endif

std::unique_ptr<Runtime> make_none(std::string why) { return std::make_unique<NoDevice>(std::move(why)); }

Runtime& runtime(const std::string& choice) {
  static std::once_flag once;
  static Runtime* chosen = nullptr;  // never destroyed: stream callbacks may outlive main
  std::call_once(once, [&] {
    std::unique_ptr<Runtime> r;
    std::string why;
    if (choice == "emulated") {
      r = make_emulated();
    } else if (choice == "none") {
      r = make_none("BRAID_GPU_BACKEND=none");
    } else {
      bool unusable_gpu = false;
      r = make_cuda(&why, &unusable_gpu);
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
