// The device path: whole programs enqueued at call time (see device_flow.hpp).
#include "core/device_flow.hpp"

#include "base/check.hpp"
#include "base/logging.hpp"
#include "compression/framed.hpp"
#include "compression/reference.hpp"
#include "core/plan_regions.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <limits>
#include <sstream>
#include <thread>

namespace braid::core {

using collectives::Buffer;
using collectives::Plan;
using collectives::Region;
using collectives::Step;
using collectives::StepKind;

namespace {

constexpr std::size_t kAlign = 256;
constexpr std::uint32_t kSet = 1;    ///< a word's value once its slot is filled or its message landed
constexpr std::uint32_t kAbort = 2;  ///< passes every wait for kSet (cyclic >=)

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

std::atomic<long> g_programs{0};
std::atomic<long long> g_slot_bytes{0};

std::mutex g_seats_mu;
std::map<int, int> g_seats;  // device -> ranks of this process that may use it

bool is_receive(StepKind k) { return k == StepKind::recv || k == StepKind::recv_reduce; }

/// Index into plan.peers of `peer`.
std::size_t queue_of(const Plan& p, int peer) {
  return static_cast<std::size_t>(std::lower_bound(p.peers.begin(), p.peers.end(), peer) - p.peers.begin());
}

/// Where a plan's regions lie for one call (the layout the host engine uses: scratch, then
/// the packed payloads at a 64-byte boundary).
struct Layout {
  const Plan* plan = nullptr;
  const FlowCall* call = nullptr;
  std::size_t elem = 1;
  std::byte* scratch = nullptr;
  std::byte* packed = nullptr;
  std::size_t frame = 1, frame_bytes = 0;

  std::byte* ptr(const Region& r) const {
    return region_address(r, call->input, call->output, scratch, packed, call->feedback, elem, frame, frame_bytes);
  }
  std::size_t bytes(const Region& r) const { return region_bytes(r, *plan, elem, frame); }
};

}  // namespace

std::vector<std::uint32_t> flow_order(const Plan& p) {
  const std::size_t n = p.steps.size();
  std::vector<std::uint8_t> placed(n, 0);
  std::vector<std::vector<std::uint32_t>> sendq(p.peers.size()), recvq(p.peers.size());
  std::vector<std::uint32_t> localq;
  for (std::uint32_t i = 0; i < n; ++i) {
    const Step& s = p.steps[i];
    if (collectives::is_local(s.kind))
      localq.push_back(i);
    else
      (s.kind == StepKind::send ? sendq : recvq)[queue_of(p, s.peer)].push_back(i);
  }
  std::vector<std::size_t> send_head(p.peers.size(), 0), recv_head(p.peers.size(), 0);
  std::size_t local_head = 0;
  const auto ready = [&](std::uint32_t i) {
    const Step& s = p.steps[i];
    for (std::uint32_t d = 0; d < s.dep_count; ++d)
      if (!placed[p.deps[s.dep_begin + d]]) return false;
    return true;
  };
  std::vector<std::uint32_t> order;
  order.reserve(n);
  const auto place = [&](std::uint32_t i) {
    placed[i] = 1;
    order.push_back(i);
  };
  while (order.size() < n) {
    // Everything that needs no wait first: sends (their data leaves early) and local steps.
    bool moved = false;
    for (std::size_t q = 0; q < sendq.size(); ++q)
      while (send_head[q] < sendq[q].size() && ready(sendq[q][send_head[q]])) {
        place(sendq[q][send_head[q]++]);
        moved = true;
      }
    while (local_head < localq.size() && ready(localq[local_head])) {
      place(localq[local_head++]);
      moved = true;
    }
    if (moved) continue;
    // Then one wait: the earliest receive that is ready.
    std::size_t best_q = recvq.size();
    for (std::size_t q = 0; q < recvq.size(); ++q)
      if (recv_head[q] < recvq[q].size() && ready(recvq[q][recv_head[q]]) &&
          (best_q == recvq.size() || recvq[q][recv_head[q]] < recvq[best_q][recv_head[best_q]]))
        best_q = q;
    BRAID_CHECK(best_q < recvq.size(), Internal,
                "plan " << p.name() << ": no step is ready after " << order.size() << " of " << n
                        << " (its dependencies admit no stream order)");
    place(recvq[best_q][recv_head[best_q]++]);
  }
  return order;
}

bool flows_complete(const std::vector<const Plan*>& plans, std::string* why) {
  const std::size_t world = plans.size();
  std::vector<std::vector<std::uint32_t>> order(world);
  std::vector<std::vector<std::uint32_t>> nth(world);  // per step: its index among receives from its peer
  for (std::size_t r = 0; r < world; ++r) {
    const Plan& p = *plans[r];
    order[r] = flow_order(p);
    nth[r].assign(p.steps.size(), 0);
    std::vector<std::uint32_t> seen(world, 0);
    for (std::uint32_t i = 0; i < p.steps.size(); ++i)
      if (is_receive(p.steps[i].kind)) nth[r][i] = seen[static_cast<std::size_t>(p.steps[i].peer)]++;
  }
  std::vector<std::vector<std::uint32_t>> sent(world, std::vector<std::uint32_t>(world, 0));  // [from][to]
  std::vector<std::size_t> pos(world, 0);
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (std::size_t r = 0; r < world; ++r) {
      const Plan& p = *plans[r];
      while (pos[r] < order[r].size()) {
        const std::uint32_t i = order[r][pos[r]];
        const Step& s = p.steps[i];
        const auto peer = static_cast<std::size_t>(s.peer);
        if (is_receive(s.kind) && sent[peer][r] <= nth[r][i]) break;  // its message is not out yet
        if (s.kind == StepKind::send) ++sent[r][peer];
        ++pos[r];
        progressed = true;
      }
    }
  }
  std::ostringstream stuck;
  for (std::size_t r = 0; r < world; ++r)
    if (pos[r] < order[r].size()) {
      const Step& s = plans[r]->steps[order[r][pos[r]]];
      stuck << " rank " << r << " waits at step " << order[r][pos[r]] << " (receive from rank " << s.peer << ", "
            << pos[r] << " of " << order[r].size() << " done);";
    }
  if (stuck.str().empty()) return true;
  if (why) *why = "stream programs stuck:" + stuck.str();
  return false;
}

// --- FlowOp ---

FlowOp::~FlowOp() {
  if (!owner_) return;
  if (!ended()) abort();
  owner_->retire(*this);
}

bool FlowOp::filled(std::uint32_t i) const noexcept {
  return static_cast<std::int32_t>(__atomic_load_n(&words_[i], __ATOMIC_ACQUIRE) - kSet) >= 0;
}

void FlowOp::landed(std::uint32_t i) noexcept { owner_->rt_.signal(&words_[i], kSet); }

bool FlowOp::ended() const noexcept {
  return static_cast<std::int32_t>(__atomic_load_n(&words_[steps_], __ATOMIC_ACQUIRE) - kSet) >= 0;
}

std::string FlowOp::failure() const { return owner_->exec_->failure(); }

void FlowOp::abort() noexcept {
  if (aborted_ || !words_) return;
  aborted_ = true;
  // Not the end word: only the stream writes it, once it has run everything (the blocks
  // are reused after that, never before).
  for (std::size_t i = 0; i < steps_; ++i) owner_->rt_.signal(&words_[i], kAbort);
}

// --- DeviceSeat ---

DeviceSeat::DeviceSeat(int device) : device_(device) {
  std::lock_guard<std::mutex> lock(g_seats_mu);
  ++g_seats[device_];
}

DeviceSeat::~DeviceSeat() {
  std::lock_guard<std::mutex> lock(g_seats_mu);
  if (--g_seats[device_] == 0) g_seats.erase(device_);
}

int DeviceSeat::taken(int device) {
  std::lock_guard<std::mutex> lock(g_seats_mu);
  const auto it = g_seats.find(device);
  return it == g_seats.end() ? 0 : it->second;
}

// --- DeviceFlow ---

DeviceFlow::DeviceFlow(gpu::Runtime& runtime, int device, std::string who, std::size_t pinned_limit)
    : rt_(runtime), device_(device), who_(std::move(who)), pinned_limit_(pinned_limit) {
  // One rank per process can never block itself: its caller's stream and this one take
  // their work in the order it was enqueued, even in one queue. Ranks that are threads of
  // one process can: rank A's stream waits for rank B's message while B's program sits
  // behind that wait in the same queue (an H100 deadlocked so at 5 and 8 thread ranks).
  const int ranks = DeviceSeat::taken(device_);
  const int queues = rt_.hw_queues();
  BRAID_CHECK(ranks <= 1 || 2 * ranks <= queues, InvalidUsage,
              who_ << ": " << ranks << " ranks of this process use GPU " << device_ << ", whose streams share "
                   << queues << " hardware queue(s) (" << rt_.describe()
                   << "). Each rank's stream waits for the others' messages, and a wait holds up every stream "
                      "behind it in its queue, so ranks of one process could wait on each other forever. Run one "
                      "process per GPU (as NCCL requires), or give each rank two queues: CUDA_DEVICE_MAX_CONNECTIONS="
                   << std::min(32, 2 * ranks) << " (at most 32) set before the process's first CUDA call"
                   << (2 * ranks > 32 ? "; more than 16 ranks of one process cannot share one GPU" : ""));
  exec_ = std::make_unique<DeviceExec>(rt_, device_);
  gpu::ScopedDevice on(rt_, device_);
  called_ = rt_.create_event();
  finished_ = rt_.create_event();
}

DeviceFlow::~DeviceFlow() {
  // Every FlowOp holds this object, so all have ended or been aborted: the stream runs to
  // its end. DeviceExec's destructor waits for it.
  exec_.reset();
  try {
    gpu::ScopedDevice on(rt_, device_);
    rt_.destroy_event(called_);
    rt_.destroy_event(finished_);
  } catch (...) {
  }
  gpu::RelaxedCapture relaxed(rt_);  // braid's frees never break an application's capture
  for (const Block& b : all_pinned_) rt_.free_pinned(b.p);
  for (const Block& b : all_device_) rt_.free_device(b.p);
}

long DeviceFlow::programs() noexcept { return g_programs.load(std::memory_order_relaxed); }
long long DeviceFlow::slot_bytes() noexcept { return g_slot_bytes.load(std::memory_order_relaxed); }

void DeviceFlow::retire(const FlowOp& op) noexcept {
  try {
    std::lock_guard<std::mutex> lock(retired_mu_);
    retired_.push_back({{op.block_, op.block_bytes_}, {op.device_, op.device_bytes_}, op.words_ + op.steps_});
  } catch (...) {
    // Out of memory: the blocks are lost, never reused while the stream may use them.
  }
}

void DeviceFlow::reclaim_locked() noexcept {
  std::lock_guard<std::mutex> lock(retired_mu_);
  for (std::size_t k = 0; k < retired_.size();) {
    const Retired& r = retired_[k];
    if (static_cast<std::int32_t>(__atomic_load_n(r.end, __ATOMIC_ACQUIRE) - kSet) < 0) {
      ++k;
      continue;
    }
    if (r.pinned.p) free_pinned_.push_back(r.pinned);
    if (r.device.p) free_device_.push_back(r.device);
    retired_[k] = retired_.back();
    retired_.pop_back();
  }
}

std::size_t DeviceFlow::pinned_held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pinned_held_;
}
std::size_t DeviceFlow::pinned_peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pinned_peak_;
}

void DeviceFlow::room_for_pinned_locked(std::size_t bytes, const FlowCall& call) {
  if (pinned_limit_ == 0) return;
  const std::size_t need = round_up(bytes, 64 * 1024);
  const auto deadline = std::chrono::steady_clock::now() + call.timeout;
  bool waited = false;
  for (;;) {
    reclaim_locked();
    std::size_t idle = 0;
    bool fits = false;
    for (const Block& b : free_pinned_) {
      idle += b.bytes;
      fits = fits || b.bytes >= bytes;
    }
    // Room now, or nothing in flight to give any back (a call alone may exceed the limit).
    if (fits || pinned_held_ + need <= pinned_limit_ || idle == pinned_held_) break;
    if (std::chrono::steady_clock::now() >= deadline)
      throw Error(ErrorCode::Timeout,
                  (call.name ? *call.name : who_) + ": timed out after " + std::to_string(call.timeout.count()) +
                      " ms waiting for pinned memory: calls in flight hold " + std::to_string(pinned_held_ - idle) +
                      " bytes, this call needs " + std::to_string(need) + " more and BRAID_DEVICE_PINNED_BYTES is " +
                      std::to_string(pinned_limit_) + "; their streams have not finished (work queued ahead of "
                      "them, or a peer that has not joined them)");
    if (!waited) {
      waited = true;
      gpu::detail::count(gpu::detail::Kind::sync);  // a host wait inside the call, counted
      BRAID_LOG(info, who_ << ": pinned memory of calls in flight at BRAID_DEVICE_PINNED_BYTES (" << pinned_limit_
                           << "): the call waits for earlier ones");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

DeviceFlow::Block DeviceFlow::take_locked(std::vector<Block>& pool, std::size_t bytes, bool pinned) {
  auto best = pool.end();
  for (auto it = pool.begin(); it != pool.end(); ++it)
    if (it->bytes >= bytes && (best == pool.end() || it->bytes < best->bytes)) best = it;
  if (best != pool.end()) {
    const Block b = *best;
    *best = pool.back();
    pool.pop_back();
    return b;
  }
  bytes = round_up(bytes, 64 * 1024);
  gpu::RelaxedCapture relaxed(rt_);  // nor its allocations, on the caller's thread
  Block b{static_cast<std::byte*>(pinned ? rt_.alloc_pinned(bytes) : rt_.alloc_device(bytes, device_)), bytes};
  (pinned ? all_pinned_ : all_device_).push_back(b);
  if (pinned) {
    pinned_held_ += bytes;
    pinned_peak_ = std::max(pinned_peak_, pinned_held_);
  }
  return b;
}

void DeviceFlow::enqueue(const Plan& plan, const FlowCall& call, gpu::Stream caller,
                         const std::function<void(std::shared_ptr<FlowOp>)>& submit) {
  const std::vector<std::uint32_t> order = flow_order(plan);
  Layout at;
  at.plan = &plan;
  at.call = &call;
  at.elem = dtype_size(call.dtype);
  std::size_t device_bytes = plan.scratch_count * at.elem;
  if (plan.packed_count > 0) {
    at.frame = plan.packed_frame;
    at.frame_bytes = compression::encoded_bytes(plan.request.codec, at.frame);
    device_bytes = round_up(device_bytes, 64) + compression::framed_bytes(plan.request.codec, at.frame, plan.packed_count);
  }
  const std::size_t steps = plan.steps.size();
  // The pinned block: the words (one per step and the end word), then each transfer's slot.
  std::vector<std::size_t> slot_at(steps, 0);
  std::size_t pinned_bytes = round_up((steps + 1) * sizeof(std::uint32_t), kAlign);
  long long moved = 0;
  for (std::size_t i = 0; i < steps; ++i) {
    const Step& s = plan.steps[i];
    if (collectives::is_local(s.kind)) continue;
    slot_at[i] = pinned_bytes;
    const std::size_t b = at.bytes(s.kind == StepKind::send ? s.src : s.dst);
    moved += static_cast<long long>(b);
    pinned_bytes += round_up(b, kAlign);
  }

  std::lock_guard<std::mutex> lock(mu_);
  reclaim_locked();
  room_for_pinned_locked(pinned_bytes, call);
  std::shared_ptr<FlowOp> op(new FlowOp);
  const Block pinned = take_locked(free_pinned_, pinned_bytes, true);
  op->block_ = pinned.p;
  op->block_bytes_ = pinned.bytes;
  if (device_bytes > 0) {
    const Block dev = take_locked(free_device_, device_bytes, false);
    op->device_ = dev.p;
    op->device_bytes_ = dev.bytes;
  }
  op->steps_ = steps;
  op->words_ = reinterpret_cast<std::uint32_t*>(op->block_);
  // The block's last call has ended (reclaim) and the progress thread is done with it:
  // plain stores, seen by the stream's waits through the enqueue below.
  std::memset(op->words_, 0, (steps + 1) * sizeof(std::uint32_t));
  op->slot_.assign(steps, nullptr);
  for (std::size_t i = 0; i < steps; ++i)
    if (!collectives::is_local(plan.steps[i].kind)) op->slot_[i] = op->block_ + slot_at[i];
  op->owner_ = shared_from_this();  // from here on its destructor retires the blocks
  at.scratch = op->device_;
  at.packed = op->device_ + round_up(plan.scratch_count * at.elem, 64);
  g_programs.fetch_add(1, std::memory_order_relaxed);
  g_slot_bytes.fetch_add(moved, std::memory_order_relaxed);
  // Held here too until the program is on the stream: the engine may fail the call (and
  // drop its hold) meanwhile.
  const std::shared_ptr<FlowOp> keep = op;
  FlowOp* const raw = keep.get();
  submit(std::move(op));

  gpu::ScopedDevice on(rt_, device_);
  DeviceExec& d = *exec_;
  const gpu::Stream s = d.stream();
  const std::string& name = call.name ? *call.name : std::string("device collective");
  try {
    rt_.record_event(called_, caller);
    rt_.wait_event(s, called_);
    for (const std::uint32_t i : order) {
      const Step& st = plan.steps[i];
      const std::string where = st.kind == StepKind::decode || st.kind == StepKind::decode_add
                                    ? name + ": step " + std::to_string(i)
                                    : std::string();
      switch (st.kind) {
        case StepKind::send:
          d.copy(raw->slot_[i], at.ptr(st.src), at.bytes(st.src));
          rt_.write_value(s, &raw->words_[i], kSet);
          break;
        case StepKind::recv:
          rt_.wait_value(s, &raw->words_[i], kSet);
          d.copy(at.ptr(st.dst), raw->slot_[i], at.bytes(st.dst));
          break;
        case StepKind::recv_reduce:
          // The kernel reads the message from its pinned slot (mapped, so the device reads it
          // in place): dst = message (op) src, elementwise, so dst may be src.
          rt_.wait_value(s, &raw->words_[i], kSet);
          if (st.scale_src)
            d.reduce_scaled(call.dtype, at.ptr(st.dst), raw->slot_[i], at.ptr(st.src), st.dst.count, call.scale);
          else
            d.reduce(call.dtype, call.op, at.ptr(st.dst), raw->slot_[i], at.ptr(st.src), st.dst.count);
          break;
        case StepKind::reduce:
          if (st.scale_src)
            d.reduce_scaled(call.dtype, at.ptr(st.dst), at.ptr(st.src2), at.ptr(st.src), st.dst.count, call.scale);
          else
            d.reduce(call.dtype, call.op, at.ptr(st.dst), at.ptr(st.src), at.ptr(st.src2), st.dst.count);
          break;
        case StepKind::copy: {
          const std::byte* from = at.ptr(st.src);
          std::byte* to = at.ptr(st.dst);
          const std::size_t n = st.dst.count * at.elem;
          BRAID_CHECK(to == from || to + n <= from || from + n <= to, Internal,
                      name << ": step " << i << ": a copy between partly overlapping regions on the device");
          d.copy(to, from, n);
          break;
        }
        case StepKind::encode: {
          const auto cs = compression::stream_spec(plan.request.codec, st.stream_rank,
                                                   static_cast<compression::Phase>(st.stream));
          float* residual = st.src2.count > 0 ? reinterpret_cast<float*>(at.ptr(st.src2)) : nullptr;
          d.encode(cs, at.frame, reinterpret_cast<const float*>(at.ptr(st.src)), residual, st.src.count,
                   reinterpret_cast<std::uint8_t*>(at.ptr(st.dst)), call.codec_step, st.at);
          break;
        }
        case StepKind::decode:
          d.decode(plan.request.codec, at.frame, reinterpret_cast<const std::uint8_t*>(at.ptr(st.src)), st.dst.count,
                   reinterpret_cast<float*>(at.ptr(st.dst)), st.sum_start, where);
          break;
        case StepKind::decode_add:
          d.decode_add(plan.request.codec, at.frame, reinterpret_cast<const std::uint8_t*>(at.ptr(st.src)),
                       st.dst.count, reinterpret_cast<float*>(at.ptr(st.dst)), where);
          break;
        case StepKind::scale:
          d.scale(call.dtype, at.ptr(st.dst), at.ptr(st.src), st.dst.count, call.scale);
          break;
      }
      if (st.finalize) d.divide(call.dtype, at.ptr(st.dst), st.dst.count, plan.request.world);
    }
    rt_.write_value(s, &raw->words_[steps], kSet);
    rt_.record_event(finished_, s);
    rt_.wait_event(caller, finished_);
  } catch (const Error& e) {
    // Part of the program is on the stream: release its waits so the stream runs on (the
    // end word may never come, so the blocks stay retired for good), and say what failed.
    raw->abort();
    throw Error(ErrorCode::Cuda, name + ": enqueueing the device program on " + who_ + "'s stream failed: " + e.what());
  }

}

}  // namespace braid::core
