// The device path (DESIGN.md §3, docs/gpu.md "The device path"): a device collective's
// whole stream program is enqueued at call time, on the caller's thread, and the host
// takes no part in the stream's progress beyond moving bytes over the network.
//
// For one call on one rank, enqueue() puts on the communicator's internal stream, in one
// go and in an order that cannot wait on anything enqueued after it (flow_order):
//   - a wait for the caller's stream (an event recorded there at the call);
//   - for each network send: a copy of the region into the send's pinned slot, then a
//     write of the step's word (cuStreamWriteValue32); the progress thread sees the word
//     and posts the send from the slot;
//   - for each network receive: a wait on the step's word (cuStreamWaitValue32), which
//     the progress thread sets once the message is in the step's pinned slot, then the
//     copy (recv) or reduce kernel (recv_reduce) out of the slot;
//   - the local steps' kernels (copy, reduce, codecs, the avg division);
//   - a write of the end word, and an event the caller's stream waits for.
// So the caller's stream never waits for the host; the internal stream waits only for
// words that the progress thread sets without any device call (host stores into pinned
// memory), and those waits come after every send that does not depend on them. The
// progress thread makes no device call at all: it polls words (host loads) and drives the
// transports. On a failure it writes every word of the call (and of calls queued behind
// it) with an abort value, so no stream is left waiting; the results are then garbage and
// the Work fails.
//
// Every transfer goes through a pinned slot of its own (the sum of a call's messages, one
// block per call, reused by later calls once the stream has passed the call): connections
// that could read device memory themselves (shm device ring, CUDA IPC, GPUDirect RDMA)
// are not used for device memory yet; DESIGN.md §3 has the plan for peer-mapped flags.
//
// One DeviceFlow per communicator (its device and stream); enqueue() is thread-safe.
#pragma once

#include "collectives/plan.hpp"
#include "core/device_exec.hpp"
#include "gpu/runtime.hpp"

#include <braid/types.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace braid::core {

class DeviceFlow;

/// The order in which a rank's stream program takes the steps of `plan`: a topological
/// order (each step after its dependencies) that keeps sends to one peer, receives from
/// one peer and local steps each in plan order, and places a receive (a stream wait)
/// only when no send or local step is ready: every send that does not depend on a
/// receive is on the stream before the stream first waits. Throws Internal where the
/// plan's dependencies admit no such order.
std::vector<std::uint32_t> flow_order(const collectives::Plan& plan);

/// Runs the stream programs of every rank's plan (plans[r] is rank r's) symbolically:
/// each rank's stream takes its steps in flow_order and stops at a receive whose message
/// has not been sent; sends are posted as soon as the stream has filled their slot (per
/// peer in plan order) and receives complete when their matching send is posted. True
/// when every stream finishes; else false with *why naming the stuck ranks (tests: the
/// order never deadlocks a plan the host engine runs).
bool flows_complete(const std::vector<const collectives::Plan*>& plans, std::string* why);

/// One call's device program, as the progress thread sees it: the pinned slot and the
/// word of each network step, and the end word. Made by DeviceFlow::enqueue.
class FlowOp {
 public:
  ~FlowOp();
  FlowOp(const FlowOp&) = delete;
  FlowOp& operator=(const FlowOp&) = delete;

  /// Step i's pinned slot (network steps only; null for local steps).
  std::byte* slot(std::uint32_t i) const { return slot_[i]; }
  /// A send's slot has been filled by the stream: it may be posted.
  bool filled(std::uint32_t i) const noexcept;
  /// A receive's message is in its slot: the stream may go on past its wait.
  void landed(std::uint32_t i) noexcept;
  /// The stream has run the whole program.
  bool ended() const noexcept;
  /// Why the device work failed (a malformed payload found by a decode), once ended;
  /// empty when nothing failed.
  std::string failure() const;
  /// Releases every wait of the program (abort value); the stream then runs to its end.
  void abort() noexcept;

 private:
  friend class DeviceFlow;
  FlowOp() = default;
  std::shared_ptr<DeviceFlow> owner_;
  std::vector<std::byte*> slot_;
  std::uint32_t* words_ = nullptr;  ///< one per step, then the end word (in block_)
  std::size_t steps_ = 0;
  std::byte* block_ = nullptr;      ///< pinned: words, then the slots
  std::size_t block_bytes_ = 0;
  std::byte* device_ = nullptr;     ///< device scratch and packed payloads
  std::size_t device_bytes_ = 0;
  bool aborted_ = false;
};

/// What enqueue() needs besides the plan: the call's buffers and reduction.
struct FlowCall {
  const void* input = nullptr;
  void* output = nullptr;
  DataType dtype = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  double scale = 1.0;  ///< premul_sum's factor
  float* feedback[2] = {nullptr, nullptr};  ///< compressed plans: device residuals
  std::uint64_t codec_step = 0;
  const std::string* name = nullptr;  ///< for error messages
  /// How long the call may wait at enqueue for earlier calls to give back pinned memory.
  std::chrono::milliseconds timeout{0};
};

/// A rank of this process that may put device programs on `device` (held by each
/// communicator that has a device runtime, from its creation, before its ranks meet, so
/// that at any rank's first device call every rank of the process is counted).
class DeviceSeat {
 public:
  explicit DeviceSeat(int device);
  ~DeviceSeat();
  DeviceSeat(const DeviceSeat&) = delete;
  DeviceSeat& operator=(const DeviceSeat&) = delete;
  /// Seats of this process on `device` now.
  static int taken(int device);

 private:
  int device_;
};

class DeviceFlow : public std::enable_shared_from_this<DeviceFlow> {
 public:
  /// The internal stream of `device`; `who` names the rank in messages. Refuses
  /// (InvalidUsage) where ranks of this process share the device's hardware queues: two
  /// streams per rank (the caller's and this one) must fit in hw_queues(), or one rank's
  /// stream wait can hold up the program of another that it waits for. `pinned_limit`:
  /// the pinned bytes its calls in flight may hold (BRAID_DEVICE_PINNED_BYTES; 0: no
  /// limit); a call that would go past it waits for earlier ones at enqueue.
  DeviceFlow(gpu::Runtime& runtime, int device, std::string who, std::size_t pinned_limit = 0);
  /// Waits (bounded) for the stream, then frees every block. Never throws.
  ~DeviceFlow();
  DeviceFlow(const DeviceFlow&) = delete;
  DeviceFlow& operator=(const DeviceFlow&) = delete;

  int device() const noexcept { return device_; }

  /// Enqueues rank `plan.request.rank`'s whole program for one call, joined to `caller`
  /// both ways. `submit` gets what the progress thread needs to drive its transfers once
  /// its slots and words exist, before anything goes on the stream (it hands the call to
  /// the engine). An error before `submit` leaves nothing behind; one after it aborts the
  /// call's words and is thrown as Error(Cuda).
  void enqueue(const collectives::Plan& plan, const FlowCall& call, gpu::Stream caller,
               const std::function<void(std::shared_ptr<FlowOp>)>& submit);

  /// How many programs this process has enqueued (tests: the device path ran), and how
  /// many bytes their transfers moved through pinned slots (tests: a compressed call's
  /// values were encoded on the device before they left it).
  static long programs() noexcept;
  static long long slot_bytes() noexcept;
  /// Pinned bytes this flow holds (in use or kept for reuse), and the most it has held.
  std::size_t pinned_held() const;
  std::size_t pinned_peak() const;

 private:
  friend class FlowOp;
  struct Block {
    std::byte* p = nullptr;
    std::size_t bytes = 0;
  };
  /// A finished (or abandoned) call's blocks, reused once `end` is set.
  struct Retired {
    Block pinned, device;
    const std::uint32_t* end = nullptr;
  };
  void retire(const FlowOp& op) noexcept;
  void reclaim_locked() noexcept;
  Block take_locked(std::vector<Block>& pool, std::size_t bytes, bool pinned);
  /// Waits (mu_ held; bounded by the call's timeout) until a pinned block of `bytes` can be
  /// had within pinned_limit_: a free one fits, there is room to allocate, or nothing is
  /// in flight to wait for.
  void room_for_pinned_locked(std::size_t bytes, const FlowCall& call);

  gpu::Runtime& rt_;
  const int device_;
  const std::string who_;
  /// Held by enqueue() across runtime calls, which a free on another thread can hold up
  /// for as long as the device is busy: never taken by the progress thread.
  mutable std::mutex mu_;
  /// Guards retired_ alone: the progress thread retires a finished call's blocks through
  /// it, so that it never waits for an enqueue stuck behind a free (which would wait for a
  /// stream that waits for this very progress thread).
  std::mutex retired_mu_;
  std::unique_ptr<DeviceExec> exec_;  ///< the internal stream and its kernels
  gpu::Event called_ = nullptr;       ///< recorded on the caller's stream at each call
  gpu::Event finished_ = nullptr;     ///< recorded on the internal stream at each call's end
  std::vector<Block> free_pinned_, free_device_, all_pinned_, all_device_;
  const std::size_t pinned_limit_;
  std::size_t pinned_held_ = 0, pinned_peak_ = 0;  ///< guarded by mu_
  std::vector<Retired> retired_;
};

}  // namespace braid::core
