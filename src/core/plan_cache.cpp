#include "core/plan_cache.hpp"

#include "compression/codec.hpp"

namespace braid::core {

std::shared_ptr<const collectives::Plan> PlanCache::plan_for(const collectives::PlanRequest& req) {
  const bool compressed = req.codec.kind != compression::CodecKind::none;
  const Key key(static_cast<int>(req.collective), static_cast<int>(req.algorithm), req.count, req.elem_size,
                static_cast<int>(req.op == ReduceOp::avg) | (req.deterministic ? 2 : 0) | (req.root << 2),
                compressed ? compression::name(req.codec) + (req.feedback ? "+ef" : "") : std::string());
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  auto plan = collectives::build_plan(req);
  if (capacity_ > 0) {
    if (plans_.size() >= capacity_) {
      plans_.erase(order_.front());
      order_.pop_front();
    }
    plans_.emplace(key, plan);
    order_.push_back(key);
  }
  return plan;
}

}  // namespace braid::core
