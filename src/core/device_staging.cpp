// Device buffers staged through pinned host memory (see device_staging.hpp).
#include "core/device_staging.hpp"

#include "base/check.hpp"
#include "base/logging.hpp"
#include "core/work_state.hpp"

#include <algorithm>
#include <chrono>
#include <sstream>

namespace braid::core {

namespace {

constexpr std::size_t kAlign = 256;
constexpr int kWordsPerBlock = 256;

std::size_t round_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::string ptr_text(const void* p) {
  std::ostringstream os;
  os << p;
  return os.str();
}

}  // namespace

/// One staged call, from post() until its stream has released it (on_released).
struct DeviceStaging::Stage {
  DeviceStaging* owner = nullptr;
  std::byte* pinned = nullptr;
  std::size_t pinned_bytes = 0;
  std::uint32_t* word = nullptr;
  std::uint32_t target = 0;
  std::shared_ptr<std::atomic<bool>> gate;
  std::function<void()> wake;
  std::shared_ptr<detail::WorkState> outer;  ///< what the caller's Work is
  std::mutex mu;
  std::exception_ptr error;  ///< the host call's outcome
};

DeviceStaging::DeviceStaging(gpu::Runtime& runtime, int device, std::string who)
    : rt_(runtime), device_(device), who_(std::move(who)) {}

DeviceStaging::~DeviceStaging() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!idle_cv_.wait_for(lock, std::chrono::seconds(30), [&] { return outstanding_ == 0; })) {
    BRAID_LOG(warn, who_ << ": " << outstanding_
                         << " device call(s) still queued on their streams after 30 s (a stream blocked by other "
                            "work?); their pinned memory is left allocated");
    return;  // a stream may still copy from or to it
  }
  gpu::RelaxedCapture relaxed(rt_);  // braid's frees never break an application's capture
  for (auto& [bytes, p] : all_) rt_.free_pinned(p);
  for (auto* w : word_blocks_) rt_.free_pinned(w);
}

int DeviceStaging::outstanding() const {
  std::lock_guard<std::mutex> lock(mu_);
  return outstanding_;
}

bool DeviceStaging::on_device(const char* what, const CallBuffers& b, MemoryKind declared, gpu::Stream stream) {
  if (declared == MemoryKind::host) return false;
  BRAID_CHECK(declared == MemoryKind::automatic || declared == MemoryKind::device, InvalidUsage,
              what << ": unknown memory kind value " << static_cast<int>(declared));
  struct Seen {
    const char* name;
    const void* p;
    gpu::PointerInfo info;
  };
  Seen seen[2];
  int n = 0;
  if (b.send && b.send_bytes) seen[n++] = {"send", b.send, rt_.classify(b.send)};
  if (b.recv && b.recv_bytes) seen[n++] = {"recv", b.recv, rt_.classify(b.recv)};
  if (n == 0) return false;  // nothing moves: the host path takes it
  for (int i = 0; i < n; ++i) {
    const Seen& s = seen[i];
    if (declared == MemoryKind::device)
      BRAID_CHECK(s.info.kind == MemoryKind::device, InvalidUsage,
                  what << ": memory = device, but the " << s.name << " buffer " << ptr_text(s.p)
                       << " is host memory (pass MemoryKind::automatic or host for host buffers)");
    if (s.info.kind == MemoryKind::device)
      BRAID_CHECK(s.info.device == device_, InvalidUsage,
                  what << ": the " << s.name << " buffer " << ptr_text(s.p) << " is memory of GPU " << s.info.device
                       << ", but " << who_ << " uses GPU " << device_
                       << "; pass buffers of GPU " << device_ << " or create the communicator with CommOptions::device = "
                       << s.info.device);
  }
  if (n == 2 && seen[0].info.kind != seen[1].info.kind) {
    const Seen& d = seen[0].info.kind == MemoryKind::device ? seen[0] : seen[1];
    const Seen& h = seen[0].info.kind == MemoryKind::device ? seen[1] : seen[0];
    throw Error(ErrorCode::InvalidUsage,
                std::string(what) + ": the " + d.name + " buffer " + ptr_text(d.p) + " is device memory (GPU " +
                    std::to_string(d.info.device) + ") but the " + h.name + " buffer " + ptr_text(h.p) +
                    " is host memory; one call takes host buffers or device buffers, not both");
  }
  if (seen[0].info.kind != MemoryKind::device) return false;
  BRAID_CHECK(!rt_.capturing(stream), Unsupported,
              what << ": stream " << ptr_text(stream)
                   << " is being captured into a CUDA graph; braid's device collectives are host-driven and cannot "
                      "be captured yet (docs/gpu.md): issue the call outside the capture");
  return true;
}

std::byte* DeviceStaging::take(std::size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The smallest free buffer that fits.
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->first >= bytes && (best == free_.end() || it->first < best->first)) best = it;
    if (best != free_.end()) {
      std::byte* p = best->second;
      free_.erase(best);
      return p;
    }
  }
  gpu::RelaxedCapture relaxed(rt_);
  auto* p = static_cast<std::byte*>(rt_.alloc_pinned(bytes));
  std::lock_guard<std::mutex> lock(mu_);
  all_.emplace_back(bytes, p);
  return p;
}

void DeviceStaging::give(std::byte* p, std::size_t) noexcept {
  // Called from a stream callback: no runtime call here, only bookkeeping.
  for (const auto& [size, q] : all_)
    if (q == p) {
      free_.emplace_back(size, p);
      return;
    }
}

std::uint32_t* DeviceStaging::take_word() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_words_.empty()) {
      auto* w = free_words_.back();
      free_words_.pop_back();
      return w;
    }
  }
  gpu::RelaxedCapture relaxed(rt_);
  auto* block = static_cast<std::uint32_t*>(rt_.alloc_pinned(kWordsPerBlock * sizeof(std::uint32_t)));
  for (int i = 0; i < kWordsPerBlock; ++i) block[i] = 0;
  std::lock_guard<std::mutex> lock(mu_);
  word_blocks_.push_back(block);
  for (int i = kWordsPerBlock - 1; i >= 1; --i) free_words_.push_back(block + i);
  return block;
}

void DeviceStaging::on_staged(void* p) noexcept {
  auto* st = static_cast<Stage*>(p);
  st->gate->store(true, std::memory_order_release);
  st->wake();
}

void DeviceStaging::on_released(void* p) noexcept {
  auto* st = static_cast<Stage*>(p);
  DeviceStaging* self = st->owner;
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(st->mu);
    error = st->error;
  }
  auto outer = std::move(st->outer);
  {
    std::lock_guard<std::mutex> lock(self->mu_);
    self->give(st->pinned, st->pinned_bytes);
    self->free_words_.push_back(st->word);
  }
  delete st;
  outer->complete(error);
  // Last: the destructor may be waiting for this to reach zero.
  std::lock_guard<std::mutex> lock(self->mu_);
  if (--self->outstanding_ == 0) self->idle_cv_.notify_all();
}

Work DeviceStaging::post(const char* what, const CallBuffers& b, gpu::Stream stream,
                         const std::function<void(std::shared_ptr<std::atomic<bool>>)>& post_gate,
                         const std::function<Work(const void*, void*)>& post_host, const std::function<void()>& wake,
                         const std::function<void(const std::string&)>& fail) {
  const auto* s = static_cast<const std::byte*>(b.send);
  auto* r = static_cast<std::byte*>(b.recv);
  const std::size_t sb = s ? b.send_bytes : 0, rb = r ? b.recv_bytes : 0;
  // One pinned copy with the same layout as the user's buffers where they overlap (the
  // in-place conventions), else two pieces of one allocation.
  std::size_t span = 0, off_s = 0, off_r = 0;
  if (sb && rb && s < r + rb && r < s + sb) {
    const std::byte* lo = std::min<const std::byte*>(s, r);
    const std::byte* hi = std::max<const std::byte*>(s + sb, r + rb);
    span = static_cast<std::size_t>(hi - lo);
    off_s = static_cast<std::size_t>(s - lo);
    off_r = static_cast<std::size_t>(r - lo);
  } else {
    off_r = round_up(sb);
    span = off_r + rb;
  }
  auto st = std::make_unique<Stage>();
  st->owner = this;
  st->pinned_bytes = span;
  st->pinned = take(span == 0 ? 1 : span);
  st->word = take_word();
  st->target = __atomic_load_n(st->word, __ATOMIC_ACQUIRE) + 1;
  // A call that reads no device memory (recv; broadcast off the root) needs no gate: it
  // may run on the host at once, since only the stream's own copy puts its result in place.
  if (sb) st->gate = std::make_shared<std::atomic<bool>>(false);
  st->wake = wake;
  st->outer = std::make_shared<detail::WorkState>();
  auto give_back = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    give(st->pinned, st->pinned_bytes);
    free_words_.push_back(st->word);
  };
  const void* pin_send = sb ? st->pinned + off_s : nullptr;
  void* pin_recv = rb ? st->pinned + off_r : nullptr;
  try {
    if (st->gate) post_gate(st->gate);
  } catch (...) {
    give_back();
    throw;
  }
  Work inner;
  try {
    inner = post_host(pin_send, pin_recv);
  } catch (...) {
    // Nothing is on the stream yet: open the gate so the engine goes on, and pass the error.
    if (st->gate) {
      st->gate->store(true, std::memory_order_release);
      wake();
    }
    give_back();
    throw;
  }
  Stage* raw = st.release();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++outstanding_;
  }
  // However the call ends, the stream goes on (the word is set).
  gpu::Runtime* rt = &rt_;
  inner.on_complete([raw, rt](std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(raw->mu);
      raw->error = e;
    }
    rt->signal(raw->word, raw->target);
  });
  Work outer(raw->outer);
  int enqueued = 0;
  try {
    if (raw->gate) {
      rt_.copy_async(const_cast<void*>(pin_send), b.send, sb, stream);
      rt_.launch_host(stream, &DeviceStaging::on_staged, raw);
    }
    ++enqueued;
    rt_.wait_value(stream, raw->word, raw->target);
    rt_.copy_async(b.recv, pin_recv, rb, stream);
    rt_.launch_host(stream, &DeviceStaging::on_released, raw);
    ++enqueued;
  } catch (const Error& e) {
    const std::string why =
        std::string(what) + ": enqueueing the device call on stream " + ptr_text(stream) + " failed: " + e.what();
    fail(why);  // fails the host call too, which sets the word
    if (enqueued == 0 && raw->gate) {
      raw->gate->store(true, std::memory_order_release);
      wake();
    }
    if (enqueued < 2) {
      // Nothing will release this call: its pinned memory stays in use (a stream may
      // still copy into it), and the caller's Work fails here.
      std::exception_ptr err = std::make_exception_ptr(Error(ErrorCode::Cuda, why));  // dies before the hand-over
      raw->outer->complete(std::move(err));
      std::lock_guard<std::mutex> lock(mu_);
      --outstanding_;
    }
    throw Error(ErrorCode::Cuda, why);
  }
  return outer;
}

}  // namespace braid::core
