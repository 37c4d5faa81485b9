// The plans a communicator has built, by what they were built for: a repeated call
// reuses its plan instead of building (and, in debug builds, verifying) it again.
#pragma once

#include "base/lru_map.hpp"
#include "collectives/plan.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

namespace braid::core {

/// Plans by request, at most `capacity` of them (BRAID_PLAN_CACHE; 0: nothing is kept),
/// the least recently used evicted first. Thread-safe: callers ask, and so does the engine
/// thread when the measuring tuner's verdict fills in deferred plans.
class PlanCache {
 public:
  explicit PlanCache(std::size_t capacity) : plans_(capacity) {}
  /// The plan for `req`: the cached one, or collectives::build_plan's, then cached.
  std::shared_ptr<const collectives::Plan> plan_for(const collectives::PlanRequest& req);

 private:
  /// Collective, algorithm, count, element size, op/deterministic/root bits, codec name
  /// with feedback ("" for none), slice bytes (device-path calls slice by
  /// BRAID_DEVICE_CHUNK_BYTES, host calls by BRAID_CHUNK_BYTES). The host map is not in it:
  /// it is fixed per communicator.
  using Key = std::tuple<int, int, std::uint64_t, std::size_t, int, std::string, std::size_t>;
  std::mutex mu_;  ///< guards plans_
  base::LruMap<Key, std::shared_ptr<const collectives::Plan>> plans_;
};

}  // namespace braid::core
