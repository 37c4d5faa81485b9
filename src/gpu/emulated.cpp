// The host-emulation device backend (tests only; BRAID_GPU_BACKEND=emulated): a device
// runtime that fails where a GPU fails, so that CI without a GPU catches what would hang
// or break on one (issue 33, item 6).
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
// * hardware queues: each device has EmulationOptions::hw_queues FIFO executors (threads,
//   made on first use), as a GPU has CUDA_DEVICE_MAX_CONNECTIONS hardware queues. Streams
//   are mapped onto their device's executors round-robin in creation order, skipping to
//   the executor with the fewest live streams once some were destroyed (the device
//   current on the creating thread), the default stream (nullptr, one per device, made on
//   first use) and copy()'s private stream included. An executor runs the work of all its
//   streams in the order it was enqueued, so stream order holds, and a wait that is not
//   yet satisfied (wait_value, wait_event) blocks the whole executor: every stream mapped
//   to it, exactly as a front-end semaphore wait blocks a hardware queue. With 1 queue
//   (CUDA_DEVICE_MAX_CONNECTIONS=1, as Megatron and NeMo set) every stream of a device
//   waits behind any wait.
// * stream memory operations: write_value stores the word on the executor (release) and
//   wakes the waiters; wait_value waits until (int32_t)(*word - value) >= 0. Waits also
//   re-read the word every 2 ms, as a GPU polls memory, so a plain store is seen too.
// * events: each record_event is a new generation, completed when the executor reaches it;
//   wait_event waits for the generation recorded last before the wait was enqueued.
// * host functions (launch_host): one process-wide host-callback thread runs them, after
//   EmulationOptions::hostfn_us microseconds of injected latency each, as the CUDA driver's
//   one callback thread does; the executor waits until the function has returned (the
//   stream does not go on before it returns).
// * launch_emulated_kernel: fn(arg) on the executor, in stream order; an exception out of
//   it is a sticky error of its device, as a kernel fault is.
// * lazy loading (EmulationOptions::lazy_loading, BRAID_EMU_LAZY_LOADING): the first launch
//   of each fn on a device quiesces the device (below) before it is enqueued, as CUDA's
//   lazy loading (the default since 12.2) loads a kernel at its first launch and waits for
//   the device to do so; load_kernels(device) loads everything at once (quiescing then).
// * the driver lock: free_device quiesces as cudaFree does: it waits until every executor
//   of the allocation's device is idle, holding a lock that every other runtime call of
//   the runtime, on any thread, must pass (the Gate). So a thread freeing device memory
//   blocks other threads' runtime calls, and a stream that waits on a host word that a
//   thread would set only after its next runtime call deadlocks, as on a GPU. signal() does
//   not pass the gate: a host store is not a driver call. Host waits (synchronize, copy,
//   destroy_stream) wait outside it, as the CUDA driver does not hold its lock while a
//   thread blocks on a stream.
// * devices and contexts: the current device is per thread (0 until set); a device's
//   context is made the first time any thread of the process makes it current, allocates on
//   it, or creates a stream or event or pinned memory with it current (CUDA's primary
//   context); EmulationHooks::contexts_made() counts them.
// * capture: begin_capture/end_capture set a flag per stream (relaxed mode). A global-mode
//   capture (EmulationHooks::begin_global_capture) makes alloc_device, alloc_pinned,
//   free_device, free_pinned, synchronize and copy on any thread in global capture mode
//   (the default; exchange_capture_mode keeps a mode per thread) invalidate it: the
//   call throws Error(Cuda) naming the capture (free_* cannot throw: they leave the memory
//   allocated, as cudaFree returns the error without freeing), and end_global_capture
//   throws cudaErrorStreamCaptureInvalidated.
// * sticky errors (EmulationHooks::inject_sticky_error): every later runtime call that
//   touches the device throws Error(Cuda) "sticky", work queued on its executors is
//   dropped, its waits are released, and host functions on its streams are not called.
// Copies are memcpy on the executor, so the order of a stream is real, and a host thread
// that reads a buffer before the stream reached it sees stale data, as on a GPU.
// destroy_stream waits for the stream's own work (CUDA returns at once and lets it finish):
// the library frees what that work uses right after destroying the stream.
#include "gpu/runtime.hpp"

#include "base/check.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>
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

/// The waits of every executor sleep here (stream words, events, host-function returns);
/// signal(), write_value, event completions, sticky errors and shutdown wake them all
/// (tests: few waiters). Process-wide, because signal() may come through any runtime.
struct Signals {
  std::mutex mu;
  std::condition_variable cv;
};
Signals& signals() {
  static auto* s = new Signals;  // never destroyed: executors may still wait at exit
  return *s;
}

/// Wakes every waiter after a change to what they wait for, made under signals().mu.
template <typename Fn>
void notify_waiters(Fn&& change) {
  auto& sig = signals();
  {
    std::lock_guard<std::mutex> lock(sig.mu);
    change();
  }
  sig.cv.notify_all();
}

/// Blocks until pred() holds (read under signals().mu). It re-reads every 2 ms besides the
/// wake-ups, as a GPU polls memory: a word stored without signal() is seen too.
template <typename Pred>
void wait_until(Pred&& pred) {
  auto& sig = signals();
  std::unique_lock<std::mutex> lock(sig.mu);
  while (!pred()) sig.cv.wait_for(lock, std::chrono::milliseconds(2));
}

/// True once the word has reached `value` in the cyclic order of CU_STREAM_WAIT_VALUE_GEQ.
bool reached(const std::uint32_t* word, std::uint32_t value) {
  return static_cast<std::int32_t>(__atomic_load_n(word, __ATOMIC_ACQUIRE) - value) >= 0;
}

/// The emulated driver lock. Runtime calls pass it (enter/leave) and free_device holds it
/// (quiesce): while it is held, every other thread's runtime call blocks at enter, as
/// cudaFree holds the driver lock while it waits for the device.
class Gate {
 public:
  void enter() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !quiescing_ || quiescer_ == std::this_thread::get_id(); });
    ++active_;
  }
  void leave() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--active_ == 0) cv_.notify_all();
  }
  /// Takes the lock for the calling thread (which has entered once, for its own call):
  /// new calls of other threads block from here on, and calls under way finish first.
  /// Its own call leaves while it waits, so that two threads freeing at once take turns.
  void begin_quiesce() {
    std::unique_lock<std::mutex> lock(mu_);
    if (--active_ == 0) cv_.notify_all();
    cv_.wait(lock, [&] { return !quiescing_; });
    quiescing_ = true;
    quiescer_ = std::this_thread::get_id();
    cv_.wait(lock, [&] { return active_ == 0; });
    ++active_;
  }
  bool quiescing() const {
    std::lock_guard<std::mutex> lock(mu_);
    return quiescing_;
  }
  void end_quiesce() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quiescing_ = false;
      quiescer_ = std::thread::id();
    }
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int active_ = 0;  ///< calls between enter and leave
  bool quiescing_ = false;
  std::thread::id quiescer_;
};

/// Sticky error flags per device, shared with host-function jobs that may outlive the
/// runtime that queued them.
using StickyFlags = std::array<std::atomic<bool>, kDevices>;

/// The process's one host-callback thread (the CUDA driver's): runs host functions in the
/// order they arrive, each after its injected latency. A forked child makes its own.
class HostCallbacks {
 public:
  struct Job {
    void (*fn)(void*) = nullptr;
    void* arg = nullptr;
    int latency_us = 0;
    int device = 0;
    std::shared_ptr<StickyFlags> sticky;
    bool done = false;  ///< under signals().mu
  };
  static HostCallbacks& get() {
    static std::mutex mu;
    static HostCallbacks* current = nullptr;  // never destroyed: its thread runs to exit
    static pid_t pid = 0;
    std::lock_guard<std::mutex> lock(mu);
    if (!current || pid != ::getpid()) {  // the parent's thread does not exist in a child
      current = new HostCallbacks;        // the parent's is leaked: nothing to join here
      pid = ::getpid();
    }
    return *current;
  }
  void push(std::shared_ptr<Job> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

 private:
  HostCallbacks() { std::thread([this] { run(); }).detach(); }
  void run() {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !jobs_.empty(); });
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      if (job->latency_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(job->latency_us));
      // After a sticky error the driver calls no more host functions of the context.
      if (!(*job->sticky)[static_cast<std::size_t>(job->device)].load()) job->fn(job->arg);
      notify_waiters([&] { job->done = true; });
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> jobs_;
};

/// A stream: where its work runs (device, executor) and how much of it has run.
struct EmuStream {
  int device = 0;
  int queue = 0;
  std::uint64_t enqueued = 0;  ///< under its executor's mutex
  std::uint64_t done = 0;      ///< under its executor's mutex
  std::atomic<bool> capturing{false};
};

/// An event: generation g is recorded by the g-th record_event and completed when its
/// executor reaches it. Completed generations below `floor` are all done; `done` holds
/// those above it (generations of one event may complete out of order across streams).
struct EventState {
  std::uint64_t recorded = 0;  ///< under signals().mu
  std::uint64_t floor = 0;
  std::set<std::uint64_t> done;
  bool complete(std::uint64_t g) const { return g <= floor || done.count(g) != 0; }
  void mark(std::uint64_t g) {
    done.insert(g);
    while (!done.empty() && *done.begin() == floor + 1) {
      done.erase(done.begin());
      ++floor;
    }
  }
};
/// What an Event handle points to: the state, shared with work that still refers to it.
struct EmuEvent {
  std::shared_ptr<EventState> state = std::make_shared<EventState>();
};

/// One hardware queue of a device: a FIFO worker thread for the streams mapped to it.
class Executor {
 public:
  Executor(int device, std::shared_ptr<StickyFlags> sticky)
      : device_(device), sticky_(std::move(sticky)), thread_([this] { run(); }) {}
  ~Executor() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void push(EmuStream* s, std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++s->enqueued;
      queue_.push_back({s, std::move(fn)});
    }
    cv_.notify_all();
  }
  /// What `s` has enqueued so far (synchronize's target).
  std::uint64_t enqueued(const EmuStream* s) {
    std::lock_guard<std::mutex> lock(mu_);
    return s->enqueued;
  }
  /// Blocks until `s` has run `target` operations.
  void wait_for(const EmuStream* s, std::uint64_t target) {
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [&] { return s->done >= target; });
  }
  /// Blocks until nothing is queued or running here.
  void wait_idle() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [&] { return queue_.empty() && !running_; });
  }

 private:
  struct Item {
    EmuStream* stream;
    std::function<void()> fn;
  };
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_, and nothing left
      Item item = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
      lock.unlock();
      // A device with a sticky error runs nothing more: its work is dropped.
      if (!(*sticky_)[static_cast<std::size_t>(device_)].load()) {
        try {
          item.fn();
        } catch (...) {
          // Only an emulated kernel throws: a fault in a kernel is a sticky error.
          notify_waiters([&] { (*sticky_)[static_cast<std::size_t>(device_)].store(true); });
        }
      }
      item.fn = nullptr;  // what it captured goes before the stream may be destroyed
      lock.lock();
      running_ = false;
      ++item.stream->done;
      idle_cv_.notify_all();
    }
  }
  const int device_;
  std::shared_ptr<StickyFlags> sticky_;
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<Item> queue_;
  bool running_ = false;
  bool stop_ = false;
  std::thread thread_;  ///< last: it starts in the constructor and uses the members above
};

class Emulated final : public Runtime, public EmulationHooks {
 public:
  explicit Emulated(const EmulationOptions& options)
      // At least one queue: 0 queues would run nothing (the configuration refuses 0).
      : queues_(std::max(1, options.hw_queues)),
        hostfn_us_(std::max(0, options.hostfn_us)),
        lazy_loading_(options.lazy_loading) {
    for (auto& flag : *sticky_) flag.store(false);
    for (auto& per_device : executors_) per_device.resize(static_cast<std::size_t>(queues_));
  }
  ~Emulated() override {
    // Waits still blocked (a test that left a stream waiting) give up, so that the
    // executors can be joined; in a forked child the parent's executors have no thread.
    notify_waiters([&] { stopping_ = true; });
    if (pid_ != ::getpid()) {
      for (auto& per_device : executors_)
        for (auto& ex : per_device) (void)ex.release();
      for (auto& s : defaults_) (void)s.release();
      for (auto& s : copy_streams_) (void)s.release();
      return;
    }
    for (auto& per_device : executors_) per_device.clear();
  }
  Backend backend() const noexcept override { return Backend::emulated; }
  std::string describe() const override {
    return "emulated (tests only): " + std::to_string(kDevices) + " devices of host memory, " +
           std::to_string(queues_) + " hardware queues each (BRAID_EMU_HW_QUEUES), host functions after " +
           std::to_string(hostfn_us_) + " us (BRAID_EMU_HOSTFN_US) (BRAID_GPU_BACKEND=emulated)";
  }
  int device_count() const noexcept override { return kDevices; }
  int current_device() override {
    Call call(*this);
    return current_;
  }
  void set_device(int device) override {
    Call call(*this);
    check_device(device);
    touch(device, "set_device");
    made_context(device);
    current_ = device;
  }
  PointerInfo classify(const void* p) override {
    Call call(*this);
    return classify_now(p);
  }
  bool capturing(Stream s) override {
    Call call(*this);
    return stream(s).capturing.load();
  }
  std::string pci_bus_id(int) override {
    Call call(*this);
    return "";  // host memory: no PCI device
  }
  // The emulated devices share host memory, as GPUs with peer access share theirs.
  bool can_access_peer(int device, int peer) override {
    Call call(*this);
    return device != peer && device >= 0 && peer >= 0 && device < kDevices && peer < kDevices;
  }

  void* alloc_device(std::size_t bytes, int device) override {
    Call call(*this);
    check_device(device);
    touch(device, "alloc_device");
    unsafe_during_global_capture("alloc_device (cudaMalloc)");
    made_context(device);
    Range r = map_device(bytes);
    r.device = device;
    void* p = reinterpret_cast<void*>(r.start);
    std::lock_guard<std::mutex> lock(mu_);
    ranges_[r.start] = r;
    return p;
  }
  void free_device(void* p) noexcept override {
    Call call(*this);
    detail::count(detail::Kind::sync);
    if (!p) return;
    int device = -1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = ranges_.find(reinterpret_cast<std::uintptr_t>(p));
      if (it == ranges_.end()) return;  // not an allocation of this runtime: nothing to free
      if (it->second.opened) return;     // another process's allocation: ipc_close unmaps it
      device = it->second.device;
    }
    // cudaFree returns an error (which nobody can see here) and frees nothing when the
    // device has a sticky error or a global capture forbids it.
    if (sticky(device) || invalidates_global_capture()) return;
    // The range is taken out while the device is quiesced, as cudaFree frees it.
    Range r;
    quiesce(device, [&] {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = ranges_.find(reinterpret_cast<std::uintptr_t>(p));
      if (it != ranges_.end()) {
        r = it->second;
        ranges_.erase(it);
      }
    });
    if (r.start == 0) return;  // freed by another thread meanwhile
    ::munmap(p, r.mapped);
    ::close(r.fd);
  }
  void* alloc_pinned(std::size_t bytes) override {
    Call call(*this);
    touch(current_, "alloc_pinned");
    unsafe_during_global_capture("alloc_pinned (cudaHostAlloc)");
    made_context(current_);
    void* p = allocate(bytes);
    std::lock_guard<std::mutex> lock(pinned_mu_);
    try {
      pinned_sizes_[p] = bytes;
    } catch (...) {
      std::free(p);
      throw;
    }
    pinned_now_ += bytes;
    pinned_max_ = std::max(pinned_max_, pinned_now_);
    return p;
  }
  void free_pinned(void* p) noexcept override {
    Call call(*this);
    if (invalidates_global_capture()) return;  // as free_device: the memory stays
    {
      std::lock_guard<std::mutex> lock(pinned_mu_);
      const auto it = pinned_sizes_.find(p);
      if (it != pinned_sizes_.end()) {
        pinned_now_ -= it->second;
        pinned_sizes_.erase(it);
      }
    }
    std::free(p);
  }
  std::size_t pinned_bytes() const noexcept override {
    std::lock_guard<std::mutex> lock(pinned_mu_);
    return pinned_now_;
  }
  std::size_t pinned_peak() const noexcept override {
    std::lock_guard<std::mutex> lock(pinned_mu_);
    return pinned_max_;
  }
  void reset_pinned_peak() noexcept override {
    std::lock_guard<std::mutex> lock(pinned_mu_);
    pinned_max_ = pinned_now_;
  }

  Stream create_stream() override {
    Call call(*this);
    touch(current_, "create_stream");
    made_context(current_);
    return new_stream(current_);
  }
  void destroy_stream(Stream s) noexcept override {
    if (!s) return;
    {
      Call call(*this);
    }
    auto* st = static_cast<EmuStream*>(s);
    // The work of the stream first (see the file's comment); dropped at once where the
    // device has a sticky error, so this returns.
    Executor& ex = executor(st->device, st->queue);
    ex.wait_for(st, ex.enqueued(st));
    stream_gone(*st);
    delete st;
  }

  void copy_async(void* dst, const void* src, std::size_t bytes, Stream s) override {
    Call call(*this);
    EmuStream& st = stream_for(s, "copy_async");
    if (bytes == 0) return;
    push(st, [=] { std::memcpy(dst, src, bytes); });
  }
  void zero_async(void* dst, std::size_t bytes, Stream s) override {
    Call call(*this);
    EmuStream& st = stream_for(s, "zero_async");
    if (bytes == 0) return;
    push(st, [=] { std::memset(dst, 0, bytes); });
  }
  void launch_host(Stream s, void (*fn)(void*), void* arg) override {
    Call call(*this);
    detail::count(detail::Kind::hostfn);
    EmuStream& st = stream_for(s, "launch_host");
    const int latency = hostfn_us_;
    const int device = st.device;
    auto sticky = sticky_;
    push(st, [=] {
      // The function runs on the callback thread; the queue waits until it has returned.
      auto job = std::make_shared<HostCallbacks::Job>();
      job->fn = fn;
      job->arg = arg;
      job->latency_us = latency;
      job->device = device;
      job->sticky = sticky;
      HostCallbacks::get().push(job);
      wait_until([&] { return job->done || released(device); });
    });
  }
  void wait_value(Stream s, std::uint32_t* word, std::uint32_t value) override {
    Call call(*this);
    detail::count(detail::Kind::memops);
    EmuStream& st = stream_for(s, "wait_value");
    const int device = st.device;
    push(st, [=] { wait_until([&] { return reached(word, value) || released(device); }); });
  }
  void write_value(Stream s, std::uint32_t* word, std::uint32_t value) override {
    Call call(*this);
    detail::count(detail::Kind::memops);
    EmuStream& st = stream_for(s, "write_value");
    push(st, [=] { notify_waiters([&] { __atomic_store_n(word, value, __ATOMIC_RELEASE); }); });
  }
  // Not a driver call: neither counted nor held at the gate (a host store goes on while a
  // thread frees device memory; it is what releases a stream waiting in that free).
  void signal(std::uint32_t* word, std::uint32_t value) noexcept override {
    notify_waiters([&] { __atomic_store_n(word, value, __ATOMIC_RELEASE); });
  }
  Event create_event() override {
    Call call(*this);
    touch(current_, "create_event");
    made_context(current_);
    return new EmuEvent;
  }
  void destroy_event(Event e) noexcept override {
    Call call(*this);
    delete static_cast<EmuEvent*>(e);  // work that refers to it holds the state
  }
  void record_event(Event e, Stream s) override {
    Call call(*this);
    EmuStream& st = stream_for(s, "record_event");
    auto state = static_cast<EmuEvent*>(e)->state;
    std::uint64_t g = 0;
    notify_waiters([&] { g = ++state->recorded; });
    push(st, [state, g] { notify_waiters([&] { state->mark(g); }); });
  }
  void wait_event(Stream s, Event e) override {
    Call call(*this);
    EmuStream& st = stream_for(s, "wait_event");
    auto state = static_cast<EmuEvent*>(e)->state;
    std::uint64_t g = 0;
    notify_waiters([&] { g = state->recorded; });  // the capture recorded last, now
    if (g == 0) return;                             // nothing recorded: no wait
    const int device = st.device;
    push(st, [=] { wait_until([&] { return state->complete(g) || released(device); }); });
  }
  int hw_queues() const noexcept override { return queues_; }
  void launch_emulated_kernel(Stream s, void (*fn)(void*), void* arg) override {
    Call call(*this);
    count_launch();
    EmuStream& st = stream_for(s, "launch_emulated_kernel");
    if (lazy_loading_) {
      bool first = false;
      {
        std::lock_guard<std::mutex> lock(load_mu_);
        first = !all_loaded_[static_cast<std::size_t>(st.device)] && loaded_.emplace(st.device, fn).second;
      }
      if (first) quiesce(st.device);  // the lazy load of a kernel waits for the device
    }
    push(st, [=] { fn(arg); });
  }
  void load_kernels(int device) override {
    Call call(*this);
    if (device < 0 || device >= kDevices) return;
    {
      std::lock_guard<std::mutex> lock(load_mu_);
      if (all_loaded_[static_cast<std::size_t>(device)]) return;
      all_loaded_[static_cast<std::size_t>(device)] = true;
    }
    if (lazy_loading_) quiesce(device);  // loading waits for the device, as any load does
  }
  void synchronize(Stream s) override {
    EmuStream* st = nullptr;
    Executor* ex = nullptr;
    std::uint64_t target = 0;
    {
      Call call(*this);
      detail::count(detail::Kind::sync);
      st = &stream_for(s, "synchronize");
      unsafe_during_global_capture("synchronize (cudaStreamSynchronize)");
      ex = &executor(st->device, st->queue);
      target = ex->enqueued(st);
    }
    ex->wait_for(st, target);  // outside the gate: the driver lock is not held while waiting
    BRAID_CHECK(!sticky(st->device), Cuda, sticky_text("synchronize", st->device));
  }
  // As the CUDA backend's copy(): through a private stream of the current device, then a
  // wait for it, so it queues behind whatever blocks that stream's hardware queue.
  void copy(void* dst, const void* src, std::size_t bytes) override {
    EmuStream* st = nullptr;
    Executor* ex = nullptr;
    std::uint64_t target = 0;
    {
      Call call(*this);
      detail::count(detail::Kind::sync);
      const int device = current_;
      touch(device, "copy");
      unsafe_during_global_capture("copy (cudaMemcpy)");
      if (bytes == 0) return;
      st = &copy_stream(device);
      push(*st, [=] { std::memcpy(dst, src, bytes); });
      ex = &executor(st->device, st->queue);
      target = ex->enqueued(st);
    }
    ex->wait_for(st, target);
    BRAID_CHECK(!sticky(st->device), Cuda, sticky_text("copy", st->device));
  }
  int exchange_capture_mode(int mode) noexcept override { return std::exchange(capture_mode_, mode); }
  void begin_capture(Stream s) override {
    Call call(*this);
    stream_for(s, "begin_capture").capturing = true;
  }
  void end_capture(Stream s) override {
    Call call(*this);
    stream_for(s, "end_capture").capturing = false;
  }
  EmulationHooks* emulation() noexcept override { return this; }

  // EmulationHooks.
  void begin_global_capture(Stream s) override {
    Call call(*this);
    EmuStream& st = stream_for(s, "begin_global_capture");
    st.capturing = true;
    std::lock_guard<std::mutex> lock(mu_);
    captures_.push_back({&st, false});
  }
  void end_global_capture(Stream s) override {
    Call call(*this);
    EmuStream& st = stream_for(s, "end_global_capture");
    st.capturing = false;
    bool invalidated = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = captures_.begin(); it != captures_.end(); ++it) {
        if (it->stream != &st) continue;
        invalidated = it->invalidated;
        captures_.erase(it);
        break;
      }
    }
    BRAID_CHECK(!invalidated, Cuda,
                "end_global_capture: cudaStreamEndCapture failed: cudaErrorStreamCaptureInvalidated: the global-mode "
                "capture of stream "
                    << s << " was invalidated by an unsafe call of another thread");
  }
  void inject_sticky_error(int device) override {
    check_device(device);
    notify_waiters([&] { (*sticky_)[static_cast<std::size_t>(device)].store(true); });
  }
  std::uint64_t contexts_made() const noexcept override { return contexts_.load(); }
  bool quiescing() const noexcept override { return gate_.quiescing(); }
  void reset_hooks() noexcept override {
    notify_waiters([&] {
      for (auto& flag : *sticky_) flag.store(false);
    });
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : captures_) c.stream->capturing = false;
    captures_.clear();
  }

  std::string dmabuf_support(int device) override {
    Call call(*this);
    if (device >= 0 && device < kDevices) return "";
    return "device " + std::to_string(device) + " does not exist (the emulated runtime has " +
           std::to_string(kDevices) + ")";
  }
  int export_dmabuf(const void* p, std::size_t bytes, std::uintptr_t* base, std::size_t* size) override {
    Call call(*this);
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
  void flush_rdma_writes(int device) override {
    Call call(*this);
    check_device(device);
    touch(device, "flush_rdma_writes");
    // The emulated NIC writes this process's memory with the CPU: a fence orders those
    // writes, seen complete by this thread, before the stream work it enqueues next.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    flushes_.fetch_add(1, std::memory_order_relaxed);
  }
  std::uint64_t rdma_flushes() const noexcept override { return flushes_.load(std::memory_order_relaxed); }

  IpcHandle ipc_export(const void* p) override {
    Call call(*this);
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
    Call call(*this);
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
    Call call(*this);
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
  mutable std::mutex pinned_mu_;
  std::unordered_map<void*, std::size_t> pinned_sizes_;
  std::size_t pinned_now_ = 0, pinned_max_ = 0;
  static void* allocate(std::size_t bytes) {
    const std::size_t rounded = (bytes + 255) / 256 * 256;
    void* p = std::aligned_alloc(256, rounded == 0 ? 256 : rounded);
    BRAID_CHECK(p != nullptr, System, "emulated device runtime: out of memory allocating " << bytes << " bytes");
    return p;
  }
  /// Every runtime call: counted (Counts), and through the gate for its duration.
  class Call {
   public:
    explicit Call(Emulated& rt) : rt_(rt) {
      detail::count_api();
      rt_.gate_.enter();
    }
    ~Call() { rt_.gate_.leave(); }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    Emulated& rt_;
  };
  static void check_device(int device) {
    BRAID_CHECK(device >= 0 && device < kDevices, InvalidUsage,
                "device " << device << " does not exist (the emulated runtime has " << kDevices << ")");
  }
  bool sticky(int device) const { return (*sticky_)[static_cast<std::size_t>(device)].load(); }
  /// Whether waits of `device` give up: a sticky error, or this runtime going away.
  bool released(int device) const { return sticky(device) || stopping_.load(); }
  static std::string sticky_text(const char* op, int device) {
    return std::string(op) + ": emulated device " + std::to_string(device) +
           " has a sticky error (cudaErrorIllegalAddress, injected): its context is unusable until the process "
           "exits, as after a fault on a GPU";
  }
  /// Throws the sticky error of `device`, if it has one.
  void touch(int device, const char* op) const { BRAID_CHECK(!sticky(device), Cuda, sticky_text(op, device)); }
  void made_context(int device) {
    if (!context_[static_cast<std::size_t>(device)].exchange(true)) contexts_.fetch_add(1);
  }
  /// True, and the capture invalidated, when a stream is being captured in global mode.
  /// Any thread's call counts, the capturing thread's too: CUDA forbids unsafe calls on
  /// every thread while a global-mode capture is under way.
  /// True (and the capture invalidated) when a global-mode capture is under way and the
  /// calling thread is in global capture mode; a thread in relaxed or thread-local mode
  /// is not held to another thread's global capture (cudaStreamCaptureMode).
  bool invalidates_global_capture(Stream* captured = nullptr) {
    if (capture_mode_ != kCaptureGlobal) return false;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : captures_) {
      c.invalidated = true;
      if (captured) *captured = c.stream;
      return true;
    }
    return false;
  }
  void unsafe_during_global_capture(const char* op) {
    Stream captured = nullptr;
    BRAID_CHECK(!invalidates_global_capture(&captured), Cuda,
                op << " failed: cudaErrorStreamCaptureUnsupported: stream " << captured
                   << " is being captured in global mode (cudaStreamCaptureModeGlobal), which forbids this call on "
                      "every thread; the capture is invalidated");
  }
  PointerInfo classify_now(const void* p) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ranges_.upper_bound(a);
    if (it == ranges_.begin()) return {};
    --it;
    if (a >= it->first + it->second.bytes) return {};
    return {MemoryKind::device, it->second.device};
  }
  /// In a forked child, forgets the parent's executors and streams of its own (their
  /// threads do not exist here; leaked, since nothing can join them). Under mu_.
  void forget_parent_locked() {
    if (pid_ == ::getpid()) return;
    for (auto& per_device : executors_)
      for (auto& ex : per_device) (void)ex.release();
    for (auto& s : defaults_) (void)s.release();
    for (auto& s : copy_streams_) (void)s.release();
    next_ = {};
    for (auto& l : live_) l.clear();
    pid_ = ::getpid();
  }
  /// A new stream of `device`, on the queue with the fewest live streams, round-robin
  /// among those (so streams made fresh go round-robin, and a process that made and
  /// destroyed many streams does not pile its live ones onto a few queues). Under mu_.
  EmuStream* new_stream_locked(int device) {
    auto& live = live_[static_cast<std::size_t>(device)];
    if (live.size() != static_cast<std::size_t>(queues_)) live.assign(static_cast<std::size_t>(queues_), 0);
    int& next = next_[static_cast<std::size_t>(device)];
    int best = next % queues_;
    for (int k = 1; k < queues_; ++k) {
      const int q = (next + k) % queues_;
      if (live[static_cast<std::size_t>(q)] < live[static_cast<std::size_t>(best)]) best = q;
    }
    next = best + 1;
    ++live[static_cast<std::size_t>(best)];
    auto* s = new EmuStream;
    s->device = device;
    s->queue = best;
    return s;
  }
  void stream_gone(const EmuStream& s) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& live = live_[static_cast<std::size_t>(s.device)];
    if (static_cast<std::size_t>(s.queue) < live.size() && live[static_cast<std::size_t>(s.queue)] > 0)
      --live[static_cast<std::size_t>(s.queue)];
  }
  EmuStream* new_stream(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    forget_parent_locked();
    return new_stream_locked(device);
  }
  EmuStream& stream(Stream s) {
    if (s) return *static_cast<EmuStream*>(s);
    // The default stream of the current device, mapped like any stream when first used.
    const int device = current_;
    std::lock_guard<std::mutex> lock(mu_);
    forget_parent_locked();
    auto& d = defaults_[static_cast<std::size_t>(device)];
    if (!d) d.reset(new_stream_locked(device));
    return *d;
  }
  /// The stream of `s`, after the sticky check of its device for `op`.
  EmuStream& stream_for(Stream s, const char* op) {
    EmuStream& st = stream(s);
    touch(st.device, op);
    return st;
  }
  EmuStream& copy_stream(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    forget_parent_locked();
    auto& c = copy_streams_[static_cast<std::size_t>(device)];
    if (!c) c.reset(new_stream_locked(device));
    return *c;
  }
  Executor& executor(int device, int queue) {
    std::lock_guard<std::mutex> lock(mu_);
    forget_parent_locked();
    auto& ex = executors_[static_cast<std::size_t>(device)][static_cast<std::size_t>(queue)];
    if (!ex) ex = std::make_unique<Executor>(device, sticky_);
    return *ex;
  }
  /// What a driver call that waits for the whole device does (cudaFree, a module load):
  /// holding the driver lock, so that other threads' runtime calls block at the gate, it
  /// waits until every executor of `device` is idle. A stream waiting for a thread blocked
  /// at the gate, or for the caller itself, never is: the deadlock of a GPU. `then` runs
  /// while the device is still quiesced.
  void quiesce(int device, const std::function<void()>& then = {}) {
    gate_.begin_quiesce();
    for (Executor* ex : executors_of(device)) ex->wait_idle();
    if (then) then();
    gate_.end_quiesce();
  }
  std::vector<Executor*> executors_of(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    forget_parent_locked();
    std::vector<Executor*> out;
    for (auto& ex : executors_[static_cast<std::size_t>(device)])
      if (ex) out.push_back(ex.get());
    return out;
  }
  void push(EmuStream& st, std::function<void()> fn) { executor(st.device, st.queue).push(&st, std::move(fn)); }

  static thread_local int current_;
  static thread_local int capture_mode_;  ///< this thread's stream-capture mode
  const int queues_;     ///< executors per device
  const int hostfn_us_;  ///< latency before each host function
  const bool lazy_loading_;  ///< a kernel's first launch on a device quiesces it (CUDA's lazy loading)
  std::shared_ptr<StickyFlags> sticky_ = std::make_shared<StickyFlags>();
  Gate gate_;
  std::mutex mu_;  ///< guards what follows, up to captures_
  std::map<std::uintptr_t, Range> ranges_;
  std::array<std::vector<std::unique_ptr<Executor>>, kDevices> executors_;
  std::array<int, kDevices> next_{};  ///< the next queue of each device (round-robin)
  std::array<std::vector<int>, kDevices> live_;  ///< live streams per queue of each device
  std::array<std::unique_ptr<EmuStream>, kDevices> defaults_;      ///< the default stream per device
  std::array<std::unique_ptr<EmuStream>, kDevices> copy_streams_;  ///< copy()'s private stream per device
  pid_t pid_ = ::getpid();  ///< the process the executors belong to
  struct Capture {
    EmuStream* stream;
    bool invalidated;
  };
  std::vector<Capture> captures_;  ///< global-mode captures under way
  std::array<std::atomic<bool>, kDevices> context_{};
  std::atomic<std::uint64_t> contexts_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> flushes_{0};
  std::mutex load_mu_;
  std::array<bool, kDevices> all_loaded_{};           ///< load_kernels() ran for the device
  std::set<std::pair<int, void (*)(void*)>> loaded_;  ///< kernels loaded by a first launch
};

thread_local int Emulated::current_ = 0;
thread_local int Emulated::capture_mode_ = kCaptureGlobal;

}  // namespace

std::unique_ptr<Runtime> make_emulated(const EmulationOptions& options) { return std::make_unique<Emulated>(options); }

}  // namespace braid::gpu
