#include "core/plan_cache.hpp"

#include "compression/codec.hpp"

namespace braid::core {

std::shared_ptr<const collectives::Plan> PlanCache::plan_for(const collectives::PlanRequest& req) {
  const bool compressed = req.codec.kind != compression::CodecKind::none;
  std::string shape = compressed ? compression::name(req.codec) + (req.feedback ? "+ef" : "") + (req.on_device ? "+dev" : "")
                                 : std::string();
  if (req.counts) {  // the v-collectives' block sizes
    shape += "v";
    for (const std::uint64_t x : *req.counts) shape.append(",").append(std::to_string(x));
  }
  const Key key(static_cast<int>(req.collective), static_cast<int>(req.algorithm), req.count, req.elem_size,
                static_cast<int>(req.op == ReduceOp::avg) | (req.deterministic ? 2 : 0) |
                    (req.op == ReduceOp::premul_sum ? 4 : 0) | (req.root << 3),
                std::move(shape), req.slice_bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (const auto* cached = plans_.find(key)) return *cached;
  auto plan = collectives::build_plan(req);
  plans_.insert(key, plan);
  return plan;
}

}  // namespace braid::core
