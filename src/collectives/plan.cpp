// Plan helpers and the algorithm dispatch.
#include "collectives/plan.hpp"

#include "collectives/algorithms.hpp"
#include "collectives/builder.hpp"

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
    case Collective::gather: return "gather";
    case Collective::scatter: return "scatter";
    case Collective::allgatherv: return "allgatherv";
    case Collective::reduce_scatter_v: return "reduce_scatter_v";
    case Collective::alltoallv: return "alltoallv";
  }
  return "?";
}

namespace {
// Blocks of the given sizes, back to back.
BlockLayout back_to_back(std::vector<std::uint64_t> count) {
  BlockLayout l;
  l.count = std::move(count);
  l.at.resize(l.count.size());
  for (std::size_t j = 0; j < l.count.size(); ++j) {
    l.at[j] = l.total;
    l.total += l.count[j];
  }
  return l;
}
// Block sizes of alltoallv's view: what it sends (first half) or receives (second half).
std::vector<std::uint64_t> view_half(const PlanRequest& req, bool sent) {
  const auto n = static_cast<std::size_t>(req.world);
  if (!req.counts || req.counts->size() != 2 * n) return std::vector<std::uint64_t>(n, 0);
  const auto first = req.counts->begin() + static_cast<std::ptrdiff_t>(sent ? 0 : n);
  return std::vector<std::uint64_t>(first, first + static_cast<std::ptrdiff_t>(n));
}
}  // namespace

BlockLayout rank_blocks(const PlanRequest& req) {
  const auto n = static_cast<std::size_t>(req.world);
  if (is_v(req.collective)) {
    if (req.counts && req.counts->size() == n) return back_to_back(*req.counts);
    return back_to_back(std::vector<std::uint64_t>(n, 0));
  }
  return back_to_back(std::vector<std::uint64_t>(n, req.count));
}

BlockLayout sent_blocks(const PlanRequest& req) {
  if (req.collective == Collective::alltoallv) return back_to_back(view_half(req, true));
  return rank_blocks(req);
}

BlockLayout received_blocks(const PlanRequest& req) {
  if (req.collective == Collective::alltoallv) return back_to_back(view_half(req, false));
  return rank_blocks(req);
}

BufferCounts buffer_counts(const PlanRequest& req) noexcept {
  const std::uint64_t n = static_cast<std::uint64_t>(req.world), c = req.count;
  switch (req.collective) {
    case Collective::allgather: return {c, c * n};
    case Collective::reduce_scatter: return {c * n, c};
    case Collective::alltoall: return {c * n, c * n};
    case Collective::reduce: return {c, req.rank == req.root ? c : 0};
    case Collective::broadcast: return {req.rank == req.root ? c : 0, c};
    case Collective::gather: return {c, req.rank == req.root ? c * n : 0};
    case Collective::scatter: return {req.rank == req.root ? c * n : 0, c};
    case Collective::allgatherv:
    case Collective::reduce_scatter_v: {
      if (!req.counts || req.counts->size() != n || req.rank < 0 || req.rank >= req.world) return {0, 0};
      std::uint64_t total = 0;
      for (const std::uint64_t x : *req.counts) total += x;
      const std::uint64_t mine = (*req.counts)[static_cast<std::size_t>(req.rank)];
      return req.collective == Collective::allgatherv ? BufferCounts{mine, total} : BufferCounts{total, mine};
    }
    case Collective::alltoallv: {
      if (!req.counts || req.counts->size() != 2 * n) return {0, 0};
      BufferCounts bc;
      for (std::size_t j = 0; j < n; ++j) {
        bc.input += (*req.counts)[j];
        bc.output += (*req.counts)[n + j];
      }
      return bc;
    }
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
    if (!is_local(s.kind)) p.insert(s.peer);
  peers.assign(p.begin(), p.end());
}

std::string Plan::describe() const {
  static const char* kinds[] = {"send", "recv", "recv_reduce", "copy", "reduce", "encode", "decode", "decode_add", "scale"};
  static const char* bufs[] = {"in", "out", "scratch", "packed", "fb_worker", "fb_owner"};
  std::ostringstream os;
  os << to_string(request.collective) << "/" << name() << " rank "
     << request.rank << "/" << request.world << " count " << request.count << ": " << steps.size()
     << " steps\n";
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    os << "  " << i << ": " << kinds[static_cast<int>(s.kind)];
    if (s.peer >= 0) os << " peer " << s.peer;
    if (s.kind != StepKind::recv)
      os << " src " << bufs[static_cast<int>(s.src.buf)] << "[" << s.src.offset << "+" << s.src.count << "]";
    if (s.kind == StepKind::reduce || (s.kind == StepKind::encode && s.src2.count > 0))
      os << " src2 " << bufs[static_cast<int>(s.src2.buf)] << "[" << s.src2.offset << "+" << s.src2.count << "]";
    if (s.scale_src) os << " (src scaled)";
    if (s.kind != StepKind::send)
      os << " dst " << bufs[static_cast<int>(s.dst.buf)] << "[" << s.dst.offset << "+" << s.dst.count << "]";
    if (s.finalize) os << " finalize";
    if (s.sum_start) os << " sum_start";
    if (s.kind == StepKind::encode)
      os << " stream " << (s.stream ? "owner" : "worker") << "@" << s.stream_rank << " at " << s.at;
    if (s.dep_count) {
      os << " after";
      for (std::uint32_t d = 0; d < s.dep_count; ++d) os << " " << deps[s.dep_begin + d];
    }
    os << "\n";
  }
  return os.str();
}

namespace {

[[noreturn]] void refuse(const PlanRequest& req) {
  std::string offered;
  for (Algorithm a : algorithms_for(req.collective)) offered += (offered.empty() ? "" : ", ") + std::string(braid::to_string(a));
  throw Error(ErrorCode::Unsupported, std::string(to_string(req.collective)) + " has no '" +
                                          std::string(braid::to_string(req.algorithm)) + "' algorithm; use auto or one of: " +
                                          offered);
}

// Until the tuner decides: by bandwidth terms alone the chain costs (n-2+S)/S·N·β
// and the binomial tree ceil(log2 n)·N·β, so the chain wins once its S slices
// outnumber (n-2)/(ceil(log2 n)-1); a message of one slice always goes to the tree.
Algorithm rooted_default(const PlanRequest& req) {
  const std::uint64_t slice = std::max<std::uint64_t>(1, req.slice_bytes / std::max<std::size_t>(1, req.elem_size));
  const std::uint64_t S = (req.count + slice - 1) / slice;
  std::uint64_t log2n = 0;
  while ((1ull << log2n) < static_cast<std::uint64_t>(req.world)) ++log2n;
  return log2n <= 1 || S * (log2n - 1) <= static_cast<std::uint64_t>(req.world) - 2 ? Algorithm::tree : Algorithm::ring;
}

}  // namespace

std::vector<Algorithm> algorithms_for(Collective c) {
  std::vector<Algorithm> v;
  for (const auto& r : algorithm_table())
    if (r.collective == c) v.push_back(r.algorithm);
  return v;
}

namespace {

/// premul_sum: the sum plan with this rank's input scaled where it is first read
/// (plan.hpp). A recv_reduce or reduce of the input scales it inside the reduction
/// (Step::scale_src); every other read of the input (a send, a copy, a reduce's second
/// operand) reads a scaled copy in fresh scratch that a scale step, placed just before it
/// with its dependencies, writes. In place, the steps that write the output (the input)
/// were ordered after the sum plan's readers of those elements, and so still are: each
/// reader now depends on its scale step.
void prescale(Plan& plan) {
  const std::vector<Step> sum_steps = std::move(plan.steps);
  const std::vector<std::uint32_t> sum_deps = std::move(plan.deps);
  plan.steps.clear();
  plan.deps.clear();
  std::uint32_t phase = kNoStep;
  std::vector<std::uint32_t> moved(sum_steps.size(), kNoStep);  // old index -> new
  std::vector<std::uint32_t> deps;
  for (std::size_t i = 0; i < sum_steps.size(); ++i) {
    Step s = sum_steps[i];
    deps.clear();
    for (std::uint32_t k = 0; k < s.dep_count; ++k) deps.push_back(moved[sum_deps[s.dep_begin + k]]);
    const bool reduces = s.kind == StepKind::recv_reduce || s.kind == StepKind::reduce;
    if (reduces && s.src.buf == Buffer::input && s.src.count > 0) s.scale_src = true;
    const std::vector<std::uint32_t> own = deps;
    for (Region* r : {&s.src, &s.src2}) {
      if (r->buf != Buffer::input || r->count == 0 || (r == &s.src && s.scale_src)) continue;
      if (r == &s.src2 && s.kind != StepKind::reduce) continue;  // src2 is a second operand of reduce only
      if (phase == kNoStep) {
        phase = static_cast<std::uint32_t>(plan.phase_names.size());
        plan.phase_names.push_back("premul scale");
      }
      const Region copy{Buffer::scratch, plan.scratch_count, r->count};
      plan.scratch_count += r->count;
      deps.push_back(plan.add(Step(StepKind::scale, -1, *r, copy, false, phase), own));
      *r = copy;
    }
    moved[i] = plan.add(s, deps);
  }
}

std::shared_ptr<Plan> build_unscaled(const PlanRequest& req);

}  // namespace

std::shared_ptr<const Plan> build_plan(const PlanRequest& req) {
  auto plan = build_unscaled(req);
  if (req.op == ReduceOp::premul_sum &&
      (req.collective == Collective::allreduce || req.collective == Collective::reduce ||
       req.collective == Collective::reduce_scatter || req.collective == Collective::reduce_scatter_v)) {
    prescale(*plan);
    plan->seal();
  }
  return plan;
}

namespace {

std::shared_ptr<Plan> build_unscaled(const PlanRequest& req) {
  if (req.world < 1 || req.rank < 0 || req.rank >= req.world)
    throw Error(ErrorCode::InvalidUsage, "plan request with rank " + std::to_string(req.rank) +
                                             " outside world of " + std::to_string(req.world));
  if ((req.collective == Collective::broadcast || req.collective == Collective::reduce ||
       req.collective == Collective::gather || req.collective == Collective::scatter) &&
      (req.root < 0 || req.root >= req.world))
    throw Error(ErrorCode::InvalidUsage, std::string(to_string(req.collective)) + " with root " +
                                             std::to_string(req.root) + " outside world of " + std::to_string(req.world));
  if (is_v(req.collective)) {
    const std::size_t n = static_cast<std::size_t>(req.world), want = req.collective == Collective::alltoallv ? 2 * n : n;
    if (!req.counts || req.counts->size() != want)
      throw Error(ErrorCode::InvalidUsage, std::string(to_string(req.collective)) + " needs " + std::to_string(want) +
                                               " block counts, got " +
                                               std::to_string(req.counts ? req.counts->size() : 0));
    if (req.deterministic)
      throw Error(ErrorCode::Unsupported, std::string(to_string(req.collective)) +
                                              " has no deterministic (rank-order) plan; use reduce_scatter with equal "
                                              "blocks, or turn deterministic mode off for this call");
  }
  auto plan = std::make_shared<Plan>();
  plan->request = req;
  Algorithm& algo = plan->request.algorithm;
  if (req.codec.kind != compression::CodecKind::none) {
    // Compression inside the all-reduce (compressed.cpp): the codec decides the schedule.
    if (req.collective != Collective::allreduce || req.codec.kind == compression::CodecKind::automatic ||
        req.deterministic || algo != Algorithm::automatic || (req.op != ReduceOp::sum && req.op != ReduceOp::avg) ||
        req.elem_size != 4)
      throw Error(ErrorCode::InvalidUsage,
                  "a compressed plan is an f32 sum or avg all-reduce with a concrete codec, algorithm automatic and "
                  "not deterministic (got " + std::string(to_string(req.collective)) + ", codec " +
                      compression::name(req.codec) + ", algorithm " + std::string(braid::to_string(algo)) + ")");
    Builder b(*plan);
    build_compressed_allreduce(b);
    if (plan->phase_names.empty()) plan->phase_names.push_back("none");
    plan->seal();
    return plan;
  }
  const auto offered = algorithms_for(req.collective);
  if (algo != Algorithm::automatic && std::find(offered.begin(), offered.end(), algo) == offered.end()) refuse(req);
  Builder b(*plan);
  if (req.deterministic && (req.collective == Collective::allreduce || req.collective == Collective::reduce ||
                            req.collective == Collective::reduce_scatter)) {
    // One fixed reduction order whatever the algorithm (deterministic.cpp).
    algo = Algorithm::ring;
    plan->label = "deterministic";
    if (req.collective == Collective::allreduce) build_deterministic_allreduce(b);
    else if (req.collective == Collective::reduce) build_deterministic_reduce(b);
    else build_deterministic_reduce_scatter(b);
    if (plan->phase_names.empty()) plan->phase_names.push_back("none");
    plan->seal();
    return plan;
  }
  if (algo == Algorithm::automatic)
    algo = req.collective == Collective::broadcast || req.collective == Collective::reduce ? rooted_default(req)
                                                                                         : offered.front();
  const AlgorithmRow* row = find_algorithm(req.collective, algo);
  if (!row->build(b)) {  // the layout does not suit it: the collective's default instead
    *plan = Plan{};
    plan->request = req;
    Builder fallback(*plan);
    row = find_algorithm(req.collective, offered.front());
    plan->request.algorithm = row->algorithm;
    row->build(fallback);
  }
  plan->label = row->label;
  if (plan->phase_names.empty()) plan->phase_names.push_back("none");
  plan->seal();
  return plan;
}

}  // namespace

}  // namespace braid::collectives
