// Error-feedback residuals owned by the library (docs/codecs.md, "Error feedback").
//
// A residual is the part of a value the codec did not transmit; it is added to the next
// step's input for the same bucket, so that over time everything is sent (Seide et al.
// 2014; Karimireddy et al. 2019). Two-phase all-reduce keeps two kinds, as 1-bit Adam:
// the worker residual (over the rank's whole bucket) and the owner residual (over the
// shard this rank reduces).
//
// Thread-safety: all member functions may be called concurrently. The returned buffer is
// not locked: the caller must not use one (key, role) from two collectives at once (a
// communicator runs its collectives in order, so this holds there). Lifetime: a buffer
// pointer stays valid until reset() of its key, reset_all(), restore() or destruction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace braid::compression {

/// Which residual of a bucket.
enum class ResidualRole : std::uint8_t {
  worker = 0,  ///< What this rank's encoding of its own input left out (whole bucket).
  owner = 1    ///< What re-encoding the reduced shard this rank owns left out.
};

/// Residual buffers keyed by (bucket key, role).
class ErrorFeedbackStore {
 public:
  ErrorFeedbackStore() = default;
  ErrorFeedbackStore(const ErrorFeedbackStore&) = delete;
  ErrorFeedbackStore& operator=(const ErrorFeedbackStore&) = delete;

  /// The residual of (key, role), `count` floats, created zero on first use. Throws
  /// braid::Error(InvalidUsage) naming the key when it exists with another count, or when
  /// key is empty.
  float* residual(const std::string& key, ResidualRole role, std::size_t count);

  /// True when (key, role) exists.
  bool contains(const std::string& key, ResidualRole role) const;

  /// Forgets both residuals of `key` (the next use starts from zero, with any count).
  /// Its step counter keeps counting, so stochastic rounding never reuses a step's
  /// random numbers for the key.
  void reset(const std::string& key);

  /// Forgets every residual (step counters keep counting, as reset()).
  void reset_all();

  /// Forgets every residual of `role`, under every key (step counters keep counting).
  void reset_role(ResidualRole role);

  /// The step of the next compressed call under `key` (0 on first use), counting it: the
  /// `step` that keys stochastic rounding. Every rank issues a key's calls in the same
  /// order, so the count agrees across ranks. The empty key (calls without error
  /// feedback) has one shared counter, which save() leaves out.
  std::uint64_t next_step(const std::string& key);

  /// Bytes of residual data held.
  std::size_t bytes() const;

  /// Number of (key, role) buffers held.
  std::size_t size() const;

  /// Writes the residuals and step counters whose keys start with `prefix` (all of them
  /// when empty) in the versioned binary format of docs/codecs.md (version 2), each key
  /// with the prefix removed, so
  /// the checkpoint can be restored under another prefix. Throws
  /// braid::Error(InvalidUsage) when a key equals a non-empty prefix (nothing would be
  /// left to name it by).
  void save(std::ostream& os, const std::string& prefix = {}) const;

  /// Replaces the residuals and step counters whose keys start with `prefix` (all of
  /// them when empty) with a checkpoint written by save(), each of its keys put back
  /// under `prefix`; keys outside the prefix (and the empty key's counter) are left as
  /// they are. Version 1 checkpoints (no step counters) restart the counters under the
  /// prefix at 0. On any error (bad magic, unknown version,
  /// truncation, checksum mismatch) throws braid::Error(InvalidUsage) and leaves the
  /// store unchanged.
  void restore(std::istream& is, const std::string& prefix = {});

 private:
  using Key = std::pair<std::string, ResidualRole>;
  mutable std::mutex mu_;
  std::map<Key, std::vector<float>> buffers_;
  std::map<std::string, std::uint64_t> steps_;  ///< per key: compressed calls so far
};

}  // namespace braid::compression
