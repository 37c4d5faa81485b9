// What the parts of a communicator (core::MeasuredTuner, core::Compressor) see of it:
// the facts fixed at its construction (Membership) and a narrow interface (Poster) to
// build its plan requests and issue operations in this rank's order, as the caller's own
// calls are. A part never reaches into the whole Communicator::Impl.
#pragma once

#include <braid/store.hpp>
#include <braid/types.hpp>
#include <braid/work.hpp>

#include "collectives/plan.hpp"
#include "core/topology.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace braid::core {

/// A plan slot filled after the operation was issued (the measuring tuner's verdict).
using DeferredPlan = std::shared_ptr<std::shared_ptr<const collectives::Plan>>;

/// One operation to post (Poster::post): its plan and buffers, and how it is treated
/// beyond them.
struct Posting {
  std::shared_ptr<const collectives::Plan> plan;
  const void* in = nullptr;
  void* out = nullptr;
  DataType dtype = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  double scale = 1.0;                    ///< premul_sum's factor
  std::chrono::milliseconds timeout{0};  ///< 0: the communicator's
  const char* what = "";                 ///< the call's name in errors and logs (read during post only)
  std::shared_ptr<void> keepalive;       ///< held until the operation completes
  DeferredPlan deferred;                 ///< plan decided later (the measuring tuner's verdict)
  bool automatic = false;  ///< the caller asked for Algorithm::automatic: BRAID_CHECK_ARGS signs "auto"
  bool internal = false;   ///< the library's own call (tuner trials, exchange): not argument-checked
  bool barrier = false;    ///< Communicator::barrier (an all-reduce of one element): metrics name it so
  /// Compressed plans: error-feedback residuals and the RNG's step (core::Operation).
  float* feedback[2] = {nullptr, nullptr};
  std::uint64_t codec_step = 0;
  /// Set: receives the operation's state (the tuner reads its trials' times).
  std::shared_ptr<detail::WorkState>* state = nullptr;
};

/// This rank's place in its communicator, fixed at construction.
struct Membership {
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{0};  ///< the communicator's default
  std::shared_ptr<Store> store;          ///< the communicator's namespace
  std::shared_ptr<Topology> topology;
};

/// How a part issues operations on its communicator. Thread-safe; the communicator
/// outlives its parts.
class Poster {
 public:
  virtual ~Poster() = default;
  /// The request every plan of this communicator starts from: this rank and world, the
  /// pipeline slice of the configuration, and the given collective, count, size and op.
  virtual collectives::PlanRequest request(collectives::Collective c, std::uint64_t count, std::size_t elem_size,
                                           ReduceOp op) const = 0;
  /// Issues one operation after every one issued before it; returns without waiting.
  virtual Work post(Posting p) = 0;
  /// Queues a host task (see core::Operation::task) and returns its Work.
  virtual Work post_task(std::function<void()> task, std::string name, std::shared_ptr<void> keepalive) = 0;
  /// A send (or receive) of `bytes` host bytes to (from) `peer` with `tag`, as
  /// Communicator::send/recv post it (the link probe's messages).
  virtual Work post_p2p(bool is_send, void* buf, std::size_t bytes, int peer, std::uint32_t tag) = 0;
};

}  // namespace braid::core
