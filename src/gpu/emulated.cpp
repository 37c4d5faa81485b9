// The host-emulation device backend (tests only; BRAID_GPU_BACKEND=emulated).
//
// What it emulates, and how:
// * device memory: host memory from aligned_alloc, recorded in a range table with its
//   device (2 emulated devices, so that "a buffer of another device" can be tested);
//   classify() looks pointers up in the table.
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

#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace braid::gpu {

namespace {

constexpr int kDevices = 2;

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
    void* p = allocate(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    ranges_[reinterpret_cast<std::uintptr_t>(p)] = {bytes == 0 ? 1 : bytes, device};
    return p;
  }
  void free_device(void* p) noexcept override {
    if (!p) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ranges_.erase(reinterpret_cast<std::uintptr_t>(p));
    }
    std::free(p);
  }
  void* alloc_pinned(std::size_t bytes) override { return allocate(bytes); }
  void free_pinned(void* p) noexcept override { std::free(p); }

  Stream create_stream() override { return new EmuStream; }
  void destroy_stream(Stream s) noexcept override { delete static_cast<EmuStream*>(s); }

  void copy_async(void* dst, const void* src, std::size_t bytes, Stream s) override {
    if (bytes == 0) return;
    stream(s).push([=] { std::memcpy(dst, src, bytes); });
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

 private:
  struct Range {
    std::size_t bytes = 0;
    int device = 0;
  };
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
};

thread_local int Emulated::current_ = 0;

}  // namespace

std::unique_ptr<Runtime> make_emulated() { return std::make_unique<Emulated>(); }

}  // namespace braid::gpu
