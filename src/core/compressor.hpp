// Compressed all-reduce as a communicator runs it (DESIGN.md §6, docs/codecs.md
// "Compressed all-reduce"). The algorithm is a plan like any other
// (collectives/compressed.cpp builds it, the verifier proves it, the cost model prices
// it, the engine runs its encode and decode steps); this part holds what compression
// keeps between calls (error-feedback residuals, each bucket's step, the codecs' rates)
// and, per call, resolves the codec (`auto`), checks the call, finds its residuals and
// posts the plan through the communicator's Poster.
#pragma once

#include <braid/options.hpp>
#include <braid/types.hpp>
#include <braid/work.hpp>

#include "compression/choose.hpp"
#include "compression/codec.hpp"
#include "compression/error_feedback.hpp"
#include "core/comm_parts.hpp"
#include "core/config.hpp"
#include "core/measured_tuner.hpp"
#include "core/plan_cache.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace braid::core {

/// All compression state of one communicator. Thread-safe. `cfg`, `tuner`, `plans` and
/// `poster` belong to the communicator and outlive this object.
class Compressor {
 public:
  Compressor(const Config& cfg, Membership member, MeasuredTuner& tuner, PlanCache& plans, Poster& poster);
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;

  /// The codec of an all-reduce: the per-call codec, else BRAID_CODEC; `auto` is priced
  /// with the cost model against the codecs' measured rates. Kind none: not compressed.
  compression::CodecSpec resolve_codec(const AllreduceOptions& options, std::size_t count, DataType dtype,
                                       ReduceOp op);
  /// Compressed all-reduce with codec `spec` (not none): checks everything before any
  /// byte moves, finds the error-feedback residuals and posts the compressed plan.
  Work allreduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                 const compression::CodecSpec& spec, const AllreduceOptions& options);
  /// The residuals kept per AllreduceOptions::ef_key (save, restore, reset; thread-safe).
  compression::ErrorFeedbackStore& error_feedback() noexcept { return error_feedback_; }

 private:
  /// Codec rates for `auto`, measured by rank 0 and shared through the store.
  const std::vector<compression::CodecRates>& codec_rates();

  const Config& cfg_;
  const Membership member_;
  MeasuredTuner& tuner_;
  PlanCache& plans_;
  Poster& poster_;
  compression::ErrorFeedbackStore error_feedback_;
  std::mutex rates_mu_;                               ///< guards rates_ and logged_auto_
  std::vector<compression::CodecRates> rates_;
  std::set<int> logged_auto_;  ///< size buckets whose auto choice was logged
  /// Codec auto: 1 when every rank is on one host (auto never compresses), 0 when not,
  /// -1 until the first automatic call looks (so later calls skip the tuner and locks).
  std::atomic<int> auto_one_host_{-1};
};

}  // namespace braid::core
