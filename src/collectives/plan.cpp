// Plan helpers and the algorithm dispatch.
#include "collectives/plan.hpp"

#include <braid/error.hpp>

#include <algorithm>
#include <set>
#include <sstream>

namespace braid::collectives {

const char* to_string(Collective c) noexcept {
  switch (c) {
    case Collective::allreduce: return "allreduce";
    case Collective::broadcast: return "broadcast";
    case Collective::reduce: return "reduce";
    case Collective::allgather: return "allgather";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::alltoall: return "alltoall";
  }
  return "?";
}

BufferCounts buffer_counts(const PlanRequest& req) noexcept {
  const std::uint64_t n = static_cast<std::uint64_t>(req.world), c = req.count;
  switch (req.collective) {
    case Collective::allgather: return {c, c * n};
    case Collective::reduce_scatter: return {c * n, c};
    case Collective::alltoall: return {c * n, c * n};
    case Collective::reduce: return {c, req.rank == req.root ? c : 0};
    case Collective::broadcast: return {req.rank == req.root ? c : 0, c};
    default: return {c, c};
  }
}

std::uint32_t Plan::add(Step step, std::initializer_list<std::uint32_t> deps_of) {
  return add(step, std::vector<std::uint32_t>(deps_of));
}

std::uint32_t Plan::add(Step step, const std::vector<std::uint32_t>& deps_of) {
  if (steps.size() >= kNoStep - 1 || deps.size() + deps_of.size() >= kNoStep)
    throw Error(ErrorCode::InvalidUsage,
                "plan too large (over 4 billion steps); raise BRAID_CHUNK_BYTES so that slices are bigger");
  step.dep_begin = static_cast<std::uint32_t>(deps.size());
  step.dep_count = 0;
  for (auto d : deps_of) {
    if (d == kNoStep) continue;
    deps.push_back(d);
    ++step.dep_count;
  }
  steps.push_back(step);
  return static_cast<std::uint32_t>(steps.size() - 1);
}

void Plan::seal() {
  std::set<int> p;
  for (const auto& s : steps)
    if (s.kind != StepKind::copy && s.kind != StepKind::reduce) p.insert(s.peer);
  peers.assign(p.begin(), p.end());
}

std::string Plan::describe() const {
  static const char* kinds[] = {"send", "recv", "recv_reduce", "copy", "reduce"};
  static const char* bufs[] = {"in", "out", "scratch"};
  std::ostringstream os;
  os << to_string(request.collective) << "/" << braid::to_string(request.algorithm) << " rank "
     << request.rank << "/" << request.world << " count " << request.count << ": " << steps.size()
     << " steps\n";
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    os << "  " << i << ": " << kinds[static_cast<int>(s.kind)];
    if (s.peer >= 0) os << " peer " << s.peer;
    if (s.kind != StepKind::recv)
      os << " src " << bufs[static_cast<int>(s.src.buf)] << "[" << s.src.offset << "+" << s.src.count << "]";
    if (s.kind == StepKind::reduce)
      os << " src2 " << bufs[static_cast<int>(s.src2.buf)] << "[" << s.src2.offset << "+" << s.src2.count << "]";
    if (s.kind != StepKind::send)
      os << " dst " << bufs[static_cast<int>(s.dst.buf)] << "[" << s.dst.offset << "+" << s.dst.count << "]";
    if (s.finalize) os << " finalize";
    if (s.dep_count) {
      os << " after";
      for (std::uint32_t d = 0; d < s.dep_count; ++d) os << " " << deps[s.dep_begin + d];
    }
    os << "\n";
  }
  return os.str();
}

std::shared_ptr<const Plan> build_plan(const PlanRequest& req) {
  if (req.world < 1 || req.rank < 0 || req.rank >= req.world)
    throw Error(ErrorCode::InvalidUsage, "plan request with rank " + std::to_string(req.rank) +
                                             " outside world of " + std::to_string(req.world));
  auto plan = std::make_shared<Plan>();
  plan->request = req;
  if (req.collective != Collective::allreduce)
    throw Error(ErrorCode::Unsupported, std::string(to_string(req.collective)) +
                                            " has no plan yet; only allreduce is implemented in this version");
  switch (req.algorithm) {
    case Algorithm::automatic:
    case Algorithm::ring:
      plan->request.algorithm = Algorithm::ring;
      build_ring_allreduce(plan->request, *plan);
      break;
    default:
      throw Error(ErrorCode::Unsupported, "all-reduce algorithm '" + std::string(braid::to_string(req.algorithm)) +
                                              "' is not implemented yet; use ring or auto");
  }
  plan->seal();
  return plan;
}

}  // namespace braid::collectives
