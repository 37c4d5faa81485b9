// The host-emulation device backend (tests only; BRAID_GPU_BACKEND=emulated).
//
// What it emulates, and how:
// * device memory: host memory, recorded in a range table with its device (2 emulated
//   devices, so that "a buffer of another device" can be tested); classify() looks
//   pointers up in the table. Each allocation is a shared mapping of its own memfd, which
//   stands in for the dma-buf of a GPU allocation: export_dmabuf() hands out a duplicate,
//   and a NIC emulation (tests/support/fakeverbs) that maps it writes the very pages the
//   device pointer reads. One file descriptor per allocation, closed by free_device().
//   The mapping is shared, so a forked child writes its parent's device memory rather
//   than a copy of it; CUDA does not work in a forked child at all, so nothing may rely
//   on either.
// * IPC (ipc_export/ipc_open): the handle is a duplicate of the allocation's memfd (to pass
//   over a Unix socket) and a 32-byte record of it (kIpcBytes); the peer maps the fd
//   shared, so both processes' pointers reach the same pages, and records the mapping as
//   device memory of the exporter's device, marked opened: it owns no fd, free_device
//   ignores it, ipc_close unmaps it.
// * GPUDirect RDMA flush: a fence (the emulated NIC writes through host memory already).
// * pinned memory: plain host memory (classified as host, as CUDA's pinned memory is).
// * streams: one FIFO worker thread per stream; the default stream (nullptr) is one
//   per process (re-created in a forked child, which has none of its parent's threads).
// * wait_value: the worker sleeps on a condition variable until signal() stores the value.
// * capture: a flag per stream set by begin_capture/end_capture.
// Copies are memcpy on the stream's thread, so the order of a stream is real, and a
// host thread that reads a buffer before the stream reached it sees stale data, as on a
// GPU.
#include "gpu/runtime.hpp"

#include "base/check.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace braid::gpu {

namespace {

constexpr int kDevices = 2;

/// The bytes of an emulated IPC handle, all integers little-endian:
///   [0, 6)   "BEIPC1" (magic and version)
///   [6, 8)   the device (uint16)
///   [8, 16)  the exporter's pid (int64)
///   [16, 24) the allocation's size as requested (uint64; 1 for a 0-byte allocation)
///   [24, 32) the mapping's length, a whole number of pages (uint64): what the fd holds
///   [32, 40) the exporter's memfd number (int64): a peer given no fd opens
///            /proc/<pid>/fd/<number> (a handle that travels as bytes only, e.g. in a
///            shared-memory segment, as a CUDA IPC handle does)
constexpr std::size_t kIpcBytes = 40;
constexpr char kIpcMagic[6] = {'B', 'E', 'I', 'P', 'C', '1'};

void put_le(std::string& out, std::size_t at, std::uint64_t v, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
std::uint64_t get_le(const std::string& in, std::size_t at, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(in[at + i])) << (8 * i);
  return v;
}

/// The waits of every stream sleep here; signal() wakes them all (tests: few waiters).
struct Signals {
  std::mutex mu;
  std::condition_variable cv;
};
Signals& signals() {
  static auto* s = new Signals;  // never destroyed: workers may still wait at exit
  return *s;
}

class EmuStream {
 public:
  EmuStream() : thread_([this] { run(); }) {}
  ~EmuStream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void push(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(fn));
    }
    cv_.notify_all();
  }
  void synchronize() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [&] { return queue_.empty() && !running_; });
  }
  bool capturing = false;

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_, and nothing left
      auto fn = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
      lock.unlock();
      fn();
      lock.lock();
      running_ = false;
      if (queue_.empty()) idle_cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> queue_;
  bool running_ = false;
  bool stop_ = false;
  std::thread thread_;
};

class Emulated final : public Runtime {
 public:
  Backend backend() const noexcept override { return Backend::emulated; }
  std::string describe() const override {
    return "emulated (tests only): " + std::to_string(kDevices) +
           " devices of host memory, streams as worker threads (BRAID_GPU_BACKEND=emulated)";
  }
  int device_count() const noexcept override { return kDevices; }
  int current_device() override { return current_; }
  void set_device(int device) override {
    BRAID_CHECK(device >= 0 && device < kDevices, InvalidUsage,
                "device " << device << " does not exist (the emulated runtime has " << kDevices << ")");
    current_ = device;
  }
  PointerInfo classify(const void* p) override {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ranges_.upper_bound(a);
    if (it == ranges_.begin()) return {};
    --it;
    if (a >= it->first + it->second.bytes) return {};
    return {MemoryKind::device, it->second.device};
  }
  bool capturing(Stream s) override { return stream(s).capturing; }
  std::string pci_bus_id(int) override { return ""; }  // host memory: no PCI device
  // The emulated devices share host memory, as GPUs with peer access share theirs.
  bool can_access_peer(int device, int peer) override {
    return device != peer && device >= 0 && peer >= 0 && device < kDevices && peer < kDevices;
  }

  void* alloc_device(std::size_t bytes, int device) override {
    BRAID_CHECK(device >= 0 && device < kDevices, InvalidUsage,
                "device " << device << " does not exist (the emulated runtime has " << kDevices << ")");
    Range r = map_device(bytes);
    r.device = device;
    void* p = reinterpret_cast<void*>(r.start);
    std::lock_guard<std::mutex> lock(mu_);
    ranges_[r.start] = r;
    return p;
  }
  void free_device(void* p) noexcept override {
    if (!p) return;
    Range r;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = ranges_.find(reinterpret_cast<std::uintptr_t>(p));
      if (it == ranges_.end()) return;  // not an allocation of this runtime: nothing to free
      if (it->second.opened) return;     // another process's allocation: ipc_close unmaps it
      r = it->second;
      ranges_.erase(it);
    }
    ::munmap(p, r.mapped);
    ::close(r.fd);
  }
  void* alloc_pinned(std::size_t bytes) override { return allocate(bytes); }
  void free_pinned(void* p) noexcept override { std::free(p); }

  Stream create_stream() override { return new EmuStream; }
  void destroy_stream(Stream s) noexcept override { delete static_cast<EmuStream*>(s); }

  void copy_async(void* dst, const void* src, std::size_t bytes, Stream s) override {
    if (bytes == 0) return;
    stream(s).push([=] { std::memcpy(dst, src, bytes); });
  }
  void zero_async(void* dst, std::size_t bytes, Stream s) override {
    if (bytes == 0) return;
    stream(s).push([=] { std::memset(dst, 0, bytes); });
  }
  void launch_host(Stream s, void (*fn)(void*), void* arg) override {
    stream(s).push([=] { fn(arg); });
  }
  void wait_value(Stream s, std::uint32_t* word, std::uint32_t value) override {
    stream(s).push([=] {
      auto& sig = signals();
      std::unique_lock<std::mutex> lock(sig.mu);
      sig.cv.wait(lock, [&] { return __atomic_load_n(word, __ATOMIC_ACQUIRE) == value; });
    });
  }
  void signal(std::uint32_t* word, std::uint32_t value) noexcept override {
    auto& sig = signals();
    {
      std::lock_guard<std::mutex> lock(sig.mu);
      __atomic_store_n(word, value, __ATOMIC_RELEASE);
    }
    sig.cv.notify_all();
  }
  void synchronize(Stream s) override { stream(s).synchronize(); }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void begin_capture(Stream s) override { stream(s).capturing = true; }
  void end_capture(Stream s) override { stream(s).capturing = false; }

  std::string dmabuf_support(int device) override {
    if (device >= 0 && device < kDevices) return "";
    return "device " + std::to_string(device) + " does not exist (the emulated runtime has " +
           std::to_string(kDevices) + ")";
  }
  int export_dmabuf(const void* p, std::size_t bytes, std::uintptr_t* base, std::size_t* size) override {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ranges_.upper_bound(a);
    BRAID_CHECK(it != ranges_.begin() && a < std::prev(it)->first + std::prev(it)->second.bytes, InvalidUsage,
                "export_dmabuf: " << p << " is not device memory (no emulated device allocation holds it; "
                                   << "host memory registers with ibv_reg_mr)");
    const Range& r = std::prev(it)->second;
    BRAID_CHECK(!r.opened, InvalidUsage,
                "export_dmabuf: " << p << " is another process's device memory, mapped here by ipc_open; "
                                  << "export it as a dma-buf in the process that allocated it");
    // Within the allocation's pages (what the fd covers): an RDMA registration is page-aligned,
    // so the page-rounded range of a buffer at the end of an allocation must be exportable.
    BRAID_CHECK(bytes <= r.start + r.mapped - a, InvalidUsage,
                "export_dmabuf: [" << p << ", +" << bytes << ") runs past the pages of its device allocation ("
                                   << reinterpret_cast<void*>(r.start) << ", " << r.bytes << " bytes, " << r.mapped
                                   << " mapped); a dma-buf covers one allocation, so register a range inside one");
    const int fd = ::fcntl(r.fd, F_DUPFD_CLOEXEC, 0);
    const int e = errno;
    BRAID_CHECK(fd >= 0, System,
                "export_dmabuf: duplicating the emulated dma-buf of " << reinterpret_cast<void*>(r.start) << " ("
                    << r.bytes << " bytes) failed: " << std::strerror(e) << " (errno " << e
                    << (e == EMFILE ? "; this process has too many open files: close some or raise ulimit -n)" : ")"));
    if (base) *base = r.start;
    if (size) *size = r.mapped;
    return fd;
  }
  void flush_rdma_writes(int) override {
    // The emulated NIC writes this process's memory with the CPU: a fence orders those
    // writes, seen complete by this thread, before the stream work it enqueues next.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    flushes_.fetch_add(1, std::memory_order_relaxed);
  }
  std::uint64_t rdma_flushes() const noexcept override { return flushes_.load(std::memory_order_relaxed); }

  IpcHandle ipc_export(const void* p) override {
    std::lock_guard<std::mutex> lock(mu_);
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = ranges_.find(a);
    if (it == ranges_.end()) {
      // Name what p is: inside an allocation (a handle covers whole allocations), or none.
      auto holder = ranges_.upper_bound(a);
      BRAID_CHECK(holder == ranges_.begin() || a >= std::prev(holder)->first + std::prev(holder)->second.bytes,
                  InvalidUsage,
                  "ipc_export: " << p << " lies inside the device allocation at "
                                 << reinterpret_cast<void*>(std::prev(holder)->first) << " ("
                                 << std::prev(holder)->second.bytes
                                 << " bytes), not at its start; a handle covers a whole allocation: export the "
                                    "pointer alloc_device returned and add the offset in the peer");
    }
    BRAID_CHECK(it != ranges_.end(), InvalidUsage,
                "ipc_export: " << p << " is not device memory (no emulated device allocation starts there): only "
                               << "what alloc_device returned can be mapped by another process");
    const Range& r = it->second;
    BRAID_CHECK(!r.opened, InvalidUsage,
                "ipc_export: " << p << " is another process's device memory, mapped here by ipc_open; "
                               << "hand on the handle its owner exported instead");
    IpcHandle h;
    h.bytes.assign(kIpcBytes, '\0');
    std::memcpy(&h.bytes[0], kIpcMagic, sizeof kIpcMagic);
    put_le(h.bytes, 6, static_cast<std::uint64_t>(r.device), 2);
    put_le(h.bytes, 8, static_cast<std::uint64_t>(static_cast<std::int64_t>(::getpid())), 8);
    put_le(h.bytes, 16, r.bytes, 8);
    put_le(h.bytes, 24, r.mapped, 8);
    put_le(h.bytes, 32, static_cast<std::uint64_t>(static_cast<std::int64_t>(r.fd)), 8);
    h.fd = ::fcntl(r.fd, F_DUPFD_CLOEXEC, 0);
    const int e = errno;
    BRAID_CHECK(h.fd >= 0, System,
                "ipc_export: duplicating the memfd of the emulated device allocation " << p << " (" << r.bytes
                    << " bytes) failed: " << std::strerror(e) << " (errno " << e
                    << (e == EMFILE ? "; this process has too many open files: close some or raise ulimit -n)" : ")"));
    return h;
  }
  void* ipc_open(IpcHandle h, std::size_t bytes) override {
    // h.fd is ours from here on, whatever happens: closed on every way out (a mapping
    // holds the file on its own).
    struct CloseFd {
      int fd;
      ~CloseFd() {
        if (fd >= 0) ::close(fd);
      }
    } close_fd{h.fd};
    BRAID_CHECK(h.bytes.size() == kIpcBytes && std::memcmp(h.bytes.data(), kIpcMagic, sizeof kIpcMagic) == 0,
                InvalidUsage,
                "ipc_open: malformed handle (" << h.bytes.size() << " bytes; an emulated handle is " << kIpcBytes
                                               << " bytes starting \"BEIPC1\"): not one that ipc_export of the "
                                                  "emulated runtime made");
    const auto device = static_cast<int>(get_le(h.bytes, 6, 2));
    const auto pid = static_cast<std::int64_t>(get_le(h.bytes, 8, 8));
    const std::uint64_t alloc_bytes = get_le(h.bytes, 16, 8);
    const std::uint64_t mapped = get_le(h.bytes, 24, 8);
    static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    BRAID_CHECK(device < kDevices && alloc_bytes > 0 && mapped >= alloc_bytes && mapped % page == 0 &&
                    mapped - alloc_bytes < page,
                InvalidUsage,
                "ipc_open: malformed handle (device " << device << ", " << alloc_bytes << " bytes, " << mapped
                                                      << " mapped): not one that ipc_export made");
    BRAID_CHECK(pid != static_cast<std::int64_t>(::getpid()), InvalidUsage,
                "ipc_open: the handle was exported by this process (pid "
                    << pid << "), which cannot open its own handles (CUDA refuses them): ranks that are threads "
                              "of one process use the pointer itself");
    if (h.fd < 0) {
      // Bytes only: the exporter's memfd through /proc (same host, and this process may
      // read the exporter's descriptors: the same user, as for CUDA IPC).
      const auto number = static_cast<std::int64_t>(get_le(h.bytes, 32, 8));
      const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(number);
      h.fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
      const int e = errno;
      close_fd.fd = h.fd;
      BRAID_CHECK(h.fd >= 0, InvalidUsage,
                  "ipc_open: the handle carries no file descriptor and " << path << " cannot be opened ("
                      << std::strerror(e) << "): the exporting process (pid " << pid
                      << ") has exited or freed the allocation, or is another user's");
    }
    BRAID_CHECK(bytes <= alloc_bytes, InvalidUsage,
                "ipc_open: the exported allocation holds " << alloc_bytes << " bytes, fewer than the " << bytes
                                                           << " asked for");
    struct stat st {};
    if (::fstat(h.fd, &st) != 0) {
      const int e = errno;
      throw Error(ErrorCode::InvalidUsage, "ipc_open: the handle's file descriptor " + std::to_string(h.fd) +
                                               " is not usable: fstat: " + std::strerror(e));
    }
    BRAID_CHECK(S_ISREG(st.st_mode) && static_cast<std::uint64_t>(st.st_size) >= mapped, InvalidUsage,
                "ipc_open: the handle's file holds " << st.st_size << " bytes, fewer than the " << mapped
                                                     << " its allocation maps (not the exporter's memfd)");
    void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, h.fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      throw Error(ErrorCode::System, "ipc_open: mapping " + std::to_string(mapped) +
                                         " bytes of another process's emulated device memory failed: mmap: " +
                                         std::strerror(e) + " (errno " + std::to_string(e) + ")");
    }
    Range r;
    r.start = reinterpret_cast<std::uintptr_t>(p);
    r.bytes = alloc_bytes;
    r.device = device;
    r.mapped = mapped;
    r.opened = true;  // fd stays -1: the mapping holds the file
    std::lock_guard<std::mutex> lock(mu_);
    ranges_[r.start] = r;
    return p;
  }
  void ipc_close(void* p) noexcept override {
    Range r;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = ranges_.find(reinterpret_cast<std::uintptr_t>(p));
      if (it == ranges_.end() || !it->second.opened) return;  // not what ipc_open returned: nothing to unmap
      r = it->second;
      ranges_.erase(it);
    }
    ::munmap(p, r.mapped);
  }

 private:
  struct Range {
    std::uintptr_t start = 0;
    std::size_t bytes = 0;   ///< as requested (1 for 0): classify() checks this
    int device = 0;
    int fd = -1;             ///< the memfd behind the mapping (the allocation's "dma-buf")
    std::size_t mapped = 0;  ///< the mapping's length: `bytes` rounded up to the page
    bool opened = false;     ///< another process's allocation mapped by ipc_open (fd -1)
  };
  /// A fresh memfd of `bytes` rounded up to the page (one page for 0), mapped shared.
  static Range map_device(std::size_t bytes) {
    static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    Range r;
    r.bytes = bytes == 0 ? 1 : bytes;
    r.mapped = (r.bytes + page - 1) / page * page;
    const auto fail = [&](const char* call) {
      const int e = errno;
      throw Error(ErrorCode::System,
                  "emulated device runtime: allocating " + std::to_string(bytes) + " bytes of device memory failed: " +
                      call + ": " + std::strerror(e) + " (errno " + std::to_string(e) +
                      (e == EMFILE || e == ENFILE
                           ? "; each emulated device allocation holds a file descriptor: free device memory or "
                             "raise ulimit -n)"
                           : ")"));
    };
    r.fd = ::memfd_create("braid-emulated-device", MFD_CLOEXEC);
    if (r.fd < 0) fail("memfd_create");
    if (::ftruncate(r.fd, static_cast<off_t>(r.mapped)) != 0) {
      const int e = errno;
      ::close(r.fd);
      errno = e;
      fail("ftruncate");
    }
    void* p = ::mmap(nullptr, r.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(r.fd);
      errno = e;
      fail("mmap");
    }
    r.start = reinterpret_cast<std::uintptr_t>(p);
    return r;
  }
  static void* allocate(std::size_t bytes) {
    const std::size_t rounded = (bytes + 255) / 256 * 256;
    void* p = std::aligned_alloc(256, rounded == 0 ? 256 : rounded);
    BRAID_CHECK(p != nullptr, System, "emulated device runtime: out of memory allocating " << bytes << " bytes");
    return p;
  }
  EmuStream& stream(Stream s) {
    if (s) return *static_cast<EmuStream*>(s);
    // The default stream: one per process; a forked child makes its own (the parent's
    // worker thread does not exist there).
    std::lock_guard<std::mutex> lock(mu_);
    if (!default_ || default_pid_ != ::getpid()) {
      if (default_) orphans_.push_back(std::move(default_));  // the parent's: its thread is not here
      default_ = std::make_unique<EmuStream>();
      default_pid_ = ::getpid();
    }
    return *default_;
  }

  static thread_local int current_;
  std::mutex mu_;
  std::map<std::uintptr_t, Range> ranges_;
  std::unique_ptr<EmuStream> default_;
  std::vector<std::unique_ptr<EmuStream>> orphans_;  ///< never destroyed (no thread to join)
  pid_t default_pid_ = 0;
  std::atomic<std::uint64_t> flushes_{0};
};

thread_local int Emulated::current_ = 0;

}  // namespace

std::unique_ptr<Runtime> make_emulated() { return std::make_unique<Emulated>(); }

}  // namespace braid::gpu
