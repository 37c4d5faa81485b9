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
#include "core/link_probe.hpp"
#include "core/measured_tuner.hpp"
#include "core/plan_cache.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace braid::core {

/// All compression state of one communicator. Thread-safe. `cfg`, `tuner`, `plans` and
/// `poster` belong to the communicator and outlive this object.
/// Rank 0's codec rates as published in the store ("<codec> <encode B/s> <decode B/s>"
/// lines, hexfloat): untrusted. False (and why) unless every line names a codec and two
/// positive finite rates.
bool parse_codec_rates(const std::string& text, std::vector<compression::CodecRates>* out, std::string* why);

class Compressor {
 public:
  Compressor(const Config& cfg, Membership member, MeasuredTuner& tuner, PlanCache& plans, Poster& poster);
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;
  /// Frees the device residuals (the communicator's engine has stopped by then).
  ~Compressor();

  /// The codec of an all-reduce: the per-call codec, else BRAID_CODEC; `auto` is priced
  /// with the cost model against the codecs' measured rates. Kind none: not compressed.
  compression::CodecSpec resolve_codec(const AllreduceOptions& options, std::size_t count, DataType dtype,
                                       ReduceOp op);
  /// Compressed all-reduce with codec `spec` (not none): checks everything before any
  /// byte moves, finds the error-feedback residuals and posts the compressed plan. f32,
  /// or bf16/f16 through an f32 copy (widened and rounded back by host tasks around it).
  /// `device` >= 0: the call runs on the direct device path (docs/gpu.md) on that GPU,
  /// so its error-feedback residuals live in that GPU's memory.
  Work allreduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                 const compression::CodecSpec& spec, const AllreduceOptions& options, int device = -1);

  /// The communicator's error-feedback API (Communicator::save_error_feedback, ...):
  /// residuals of the host store and, for keys whose calls run on the device, of GPU
  /// memory. A key's residuals live where its first call after creation, reset() or
  /// restore() put them; a call of the other memory kind under that key is refused.
  void save_feedback(std::ostream& os, const std::string& prefix);
  void restore_feedback(std::istream& is, const std::string& prefix);
  /// Empty key: every key.
  void reset_feedback(const std::string& key);
  /// After a shrink, in the child: takes `parent`'s residuals and step counters. Each
  /// rank's worker residuals (what its own inputs' encodings left out) carry over; the
  /// owner residuals start from zero, since the new size cuts the buckets into other shards.
  void adopt_feedback(Compressor& parent);
  std::size_t feedback_bytes() const;

  /// The link between hosts that `auto` prices with: measured once (core/link_probe.hpp),
  /// at the first call that asks, by rank 0 and its partner, and taken from the store by
  /// the others; every rank must ask at the same point of its call order (the first
  /// automatic all-reduce across hosts, or Communicator::link_between_hosts). `a` = -1:
  /// every rank is on one host, nothing measured.
  LinkFigures link_between_hosts();
  /// Figures measured by the parent of a child communicator (split, shrink): the child
  /// takes them instead of measuring again.
  void inherit_link(const Compressor& parent);

 private:
  /// The compressed plan of a checked f32 call: its residuals found (or made) and the
  /// operation posted. `what` names the call.
  Work post(const void* send, void* recv, std::size_t count, ReduceOp op, const compression::CodecSpec& spec,
            const AllreduceOptions& options, int device, const std::string& what);
  /// Codec rates for `auto`, measured by rank 0 and shared through the store.
  const std::vector<compression::CodecRates>& codec_rates();

  const Config& cfg_;
  const Membership member_;
  MeasuredTuner& tuner_;
  PlanCache& plans_;
  Poster& poster_;
  /// Residuals of `key` for a call on device buffers of GPU `device` (direct path): made
  /// on first use from the host store's values (zero, or restored), which are then
  /// dropped; refuses a key whose residuals are in host memory.
  float* device_residual(const std::string& key, compression::ResidualRole role, std::size_t count, int device,
                         const std::string& what);
  /// Frees the device residuals of `key` (empty: all). Caller holds feedback_mu_.
  void free_device_residuals(const std::string& key);
  /// Copies the device residuals of keys under `prefix` into the host store, adding each
  /// key to *keys before its copy (so that a failed copy still leaves the list of what to
  /// take out again). Caller holds feedback_mu_.
  void download_device_residuals(const std::string& prefix, std::vector<std::string>* keys);

  compression::ErrorFeedbackStore error_feedback_;
  struct DeviceResidual {
    float* p = nullptr;
    std::size_t count = 0;
    int device = -1;
  };
  mutable std::mutex feedback_mu_;  ///< guards the two maps below
  std::map<std::pair<std::string, compression::ResidualRole>, DeviceResidual> device_residuals_;
  /// Where each key's residuals live once a call has used it: true on the device.
  std::map<std::string, bool> on_device_;
  std::mutex rates_mu_;                               ///< guards rates_ and logged_auto_
  std::vector<compression::CodecRates> rates_;
  std::set<int> logged_auto_;  ///< size buckets whose auto choice was logged
  /// Codec auto: 1 when every rank is on one host (auto never compresses), 0 when not,
  /// -1 until the first automatic call looks (so later calls skip the tuner and locks).
  std::atomic<int> auto_one_host_{-1};
  std::optional<compression::CodecSpec> configured_;  ///< BRAID_CODEC parsed (empty: it does not parse)
  mutable std::mutex link_mu_;          ///< guards link_ (held through the probe)
  std::optional<LinkFigures> link_;     ///< measured (or inherited) once
};

}  // namespace braid::core
