// Proves every collective and every all-reduce algorithm with the symbolic verifier
// (world sizes 1..64, awkward counts, in place and out of place, several roots,
// deterministic mode), checks the bytes each rank puts on the wire against the
// formulas of docs/algorithms.md, and shows the verifier rejecting broken plans of
// the new kinds.
#include "collectives/algorithms.hpp"
#include "collectives/plan.hpp"
#include "collectives/verifier.hpp"

#include <braid/error.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace braid;
using namespace braid::collectives;

namespace {

struct Variant {
  Collective collective;
  Algorithm algorithm;
  bool deterministic = false;
  bool hosts = false;  ///< give a host map (several ranks per host where the world allows)
};

std::string name(const Variant& v) {
  std::ostringstream os;
  os << to_string(v.collective) << "/" << braid::to_string(v.algorithm) << (v.deterministic ? "/deterministic" : "")
     << (v.hosts ? "/hosts" : "");
  return os.str();
}

// A host map with `per_host` consecutive ranks per host (the last host may have fewer).
std::shared_ptr<const std::vector<int>> hosts(int world, int per_host) {
  auto h = std::make_shared<std::vector<int>>();
  for (int r = 0; r < world; ++r) h->push_back(r / per_host);
  return h;
}

PlanRequest request(const Variant& v, int world, std::uint64_t count, std::size_t slice_bytes, int root = 0,
                    ReduceOp op = ReduceOp::sum) {
  PlanRequest req(v.collective, world, count, 4, op);
  req.algorithm = v.algorithm;
  req.slice_bytes = slice_bytes;
  req.root = root;
  req.deterministic = v.deterministic;
  if (v.hosts) req.host_of = hosts(world, world % 4 == 0 ? 4 : world % 3 == 0 ? 3 : 2);
  return req;
}

bool rooted(Collective c) {
  return c == Collective::broadcast || c == Collective::reduce || c == Collective::gather || c == Collective::scatter;
}
bool reduces(Collective c) {
  return c == Collective::allreduce || c == Collective::reduce || c == Collective::reduce_scatter;
}
// Collectives whose count is per rank block: buffers grow with the world.
bool blocked(Collective c) {
  return c == Collective::allgather || c == Collective::reduce_scatter || c == Collective::alltoall ||
         c == Collective::gather || c == Collective::scatter;
}

std::vector<Variant> all_variants() {
  std::vector<Variant> v;
  for (Algorithm a : algorithms_for(Collective::allreduce)) {
    v.push_back({Collective::allreduce, a});
    if (a == Algorithm::hierarchical || a == Algorithm::ring) v.push_back({Collective::allreduce, a, false, true});
  }
  for (Collective c : {Collective::broadcast, Collective::reduce, Collective::allgather, Collective::reduce_scatter,
                       Collective::alltoall, Collective::gather, Collective::scatter})
    for (Algorithm a : algorithms_for(c)) v.push_back({c, a});
  // Deterministic mode: one plan per reducing collective, whatever the algorithm.
  v.push_back({Collective::allreduce, Algorithm::tree, true});
  v.push_back({Collective::allreduce, Algorithm::hierarchical, true, true});
  v.push_back({Collective::reduce, Algorithm::tree, true});
  v.push_back({Collective::reduce_scatter, Algorithm::ring, true});
  return v;
}

// Verifies one case; returns an empty string or the failure, naming the case.
std::string prove(const PlanRequest& req, bool in_place, std::uint64_t seed) {
  VerifyOptions o;
  o.in_place = in_place;
  o.seed = seed;
  o.post_first = seed % 2 == 1;  // half the runs in the engine's order
  const auto r = verify_plans(req, o);
  if (r.ok) return {};
  std::ostringstream os;
  os << to_string(req.collective) << "/" << braid::to_string(req.algorithm)
     << (req.deterministic ? " deterministic" : "") << (req.host_of ? " hosts" : "") << " world " << req.world
     << " count " << req.count << " slice " << req.slice_bytes << " root " << req.root << " op "
     << braid::to_string(req.op) << (in_place ? " in place" : "") << ": " << r.error;
  return os.str();
}

// Worlds 1..64 and awkward counts: every combination for small worlds, fewer (but each
// still covered by some world) for large ones, to keep the run short.
void prove_everywhere(const Variant& v) {
  for (int world = 1; world <= 64; ++world) {
    const bool small = world <= 9;
    const std::uint64_t w = static_cast<std::uint64_t>(world);
    std::vector<std::uint64_t> counts;
    if (blocked(v.collective) && world > 16) counts = {0, 1, 3};
    else if (small) counts = {0, 1, 2, 7, 13, w, w + 1, 97, 3 * w + 2};
    else counts = {1, 13, w + 1, 3 * w + 2};
    std::vector<int> roots = {0};
    if (rooted(v.collective)) roots = small ? std::vector<int>{0, world / 2, world - 1} : std::vector<int>{world - 1};
    for (std::uint64_t count : counts)
      for (std::size_t slice : {4ul, 12ul, 1ul << 20}) {
        if (!small && slice == 12) continue;
        for (int root : roots)
          for (bool in_place : {false, true}) {
            if (!small && in_place != ((count + slice + static_cast<std::uint64_t>(root)) % 2 == 1)) continue;
            const std::uint64_t pick = (count + w + slice) % 3;
            const ReduceOp op = !reduces(v.collective) ? ReduceOp::sum
                                : pick == 0             ? ReduceOp::avg
                                : pick == 1             ? ReduceOp::premul_sum
                                                        : ReduceOp::sum;
            const auto err = prove(request(v, world, count, slice, root, op), in_place, w * 131 + count + slice);
            ASSERT_TRUE(err.empty()) << err;
          }
      }
  }
}

}  // namespace

// ---- every collective and algorithm, proven ------------------------------------------

class EveryPlan : public ::testing::TestWithParam<Variant> {};

TEST_P(EveryPlan, ProvenForWorlds1To64AndAwkwardCounts) { prove_everywhere(GetParam()); }

TEST_P(EveryPlan, ProvenUnderManyInterleavingsAndEagerSends) {
  // One awkward layout, many interleavings; eager sends (shm-like) as well as
  // rendezvous, and unlimited staging as well as the engine's 8 buffers.
  const Variant v = GetParam();
  for (std::uint64_t seed = 0; seed < 60; ++seed) {
    const int world = 5 + static_cast<int>(seed % 4);
    auto req = request(v, world, 23, 8, static_cast<int>(seed) % world,
                       !reduces(v.collective) ? ReduceOp::sum
                       : seed % 5 == 0        ? ReduceOp::avg
                       : seed % 5 == 1        ? ReduceOp::premul_sum
                                              : ReduceOp::sum);
    VerifyOptions o;
    o.in_place = seed % 2 == 0;
    o.seed = seed;
    o.rendezvous = seed % 3 != 0;
    o.staging_slots = seed % 4 == 0 ? 0 : 8;
    o.post_first = seed % 5 < 2;
    const auto r = verify_plans(req, o);
    ASSERT_TRUE(r.ok) << name(v) << " seed " << seed << ": " << r.error;
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, EveryPlan, ::testing::ValuesIn(all_variants()),
                         [](const ::testing::TestParamInfo<Variant>& i) {
                           std::string s = name(i.param);
                           std::replace(s.begin(), s.end(), '/', '_');
                           return s;
                         });

// ---- dispatch ------------------------------------------------------------------------

TEST(PlanDispatch, ResolvesAutomaticAndRefusesWhatACollectiveDoesNotOffer) {
  PlanRequest req;
  req.world = 4;
  req.count = 10;
  req.collective = Collective::alltoall;
  req.algorithm = Algorithm::tree;
  try {
    build_plan(req);
    FAIL() << "alltoall has no tree";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Unsupported);
    EXPECT_NE(std::string(e.what()).find("ring"), std::string::npos) << e.what();
  }
  req.algorithm = Algorithm::automatic;
  EXPECT_EQ(build_plan(req)->request.algorithm, Algorithm::ring);
  // Rooted collectives: the tree for a message that fits in a slice, the chain once
  // it has enough slices to fill the pipeline (more for bigger worlds).
  req.collective = Collective::broadcast;
  req.slice_bytes = 1024;
  EXPECT_EQ(build_plan(req)->request.algorithm, Algorithm::tree);
  req.count = 1000;  // 4 slices
  EXPECT_EQ(build_plan(req)->request.algorithm, Algorithm::ring);
  req.world = 64;  // a chain of 64 needs more than (64-2)/5 slices
  EXPECT_EQ(build_plan(req)->request.algorithm, Algorithm::tree);
  req.count = 4000;  // 16 slices
  EXPECT_EQ(build_plan(req)->request.algorithm, Algorithm::ring);
  req.collective = Collective::reduce;
  EXPECT_EQ(build_plan(req)->request.algorithm, Algorithm::ring);
  req.world = 4;
  req.root = 4;
  EXPECT_THROW(build_plan(req), Error);
}

// Logs, errors and explain_allreduce give a plan's name: the algorithm's, or what was
// really built where the enum cannot say it.
TEST(PlanDispatch, NamesWhatWasBuilt) {
  PlanRequest req;
  req.world = 4;
  req.count = 10;
  req.collective = Collective::alltoall;
  EXPECT_STREQ(build_plan(req)->name(), "pairwise");
  req.collective = Collective::allreduce;
  req.algorithm = Algorithm::tree;
  EXPECT_STREQ(build_plan(req)->name(), "tree");
  req.deterministic = true;
  EXPECT_STREQ(build_plan(req)->name(), "deterministic");
  EXPECT_NE(build_plan(req)->describe().find("allreduce/deterministic"), std::string::npos);
}

// ---- bytes on the wire -----------------------------------------------------------------

namespace {
VerifyResult run(const PlanRequest& req) {
  auto r = verify_plans(req, VerifyOptions{});
  EXPECT_TRUE(r.ok) << r.error;
  return r;
}
int ceil_log2(int n) {
  int d = 0;
  while ((1 << d) < n) ++d;
  return d;
}
}  // namespace

TEST(WireBytes, MatchTheDocumentedFormulas) {
  // Counts divisible by every chunking so that the formulas are exact.
  for (int n : {2, 3, 4, 5, 6, 7, 8, 12, 13}) {
    const std::uint64_t w = static_cast<std::uint64_t>(n);
    const std::uint64_t N = 10920;  // divisible by 1..8, 12 and 13
    const std::uint64_t c = 12;      // per-block count
    // Ring all-reduce: 2(n-1)/n·N sent and received by every rank.
    {
      auto r = run(request({Collective::allreduce, Algorithm::ring}, n, N, 1 << 30));
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(r.sent[i], 2 * (w - 1) * N / w) << n;
        EXPECT_EQ(r.received[i], 2 * (w - 1) * N / w) << n;
      }
    }
    // Allgather, reduce-scatter, alltoall: (n-1)·count each way.
    for (Collective coll : {Collective::allgather, Collective::reduce_scatter, Collective::alltoall}) {
      auto r = run(request({coll, Algorithm::ring}, n, c, 1 << 30));
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(r.sent[i], (w - 1) * c) << to_string(coll) << " " << n;
        EXPECT_EQ(r.received[i], (w - 1) * c) << to_string(coll) << " " << n;
      }
    }
    for (int root : {0, n - 1}) {
      // Chain broadcast/reduce: N per hop; the root only sends (broadcast) or only
      // receives (reduce), the chain's end the other way round.
      auto bc = run(request({Collective::broadcast, Algorithm::ring}, n, N, 1024, root));
      auto rd = run(request({Collective::reduce, Algorithm::ring}, n, N, 1024, root));
      std::uint64_t sent = 0;
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(bc.received[i], i == root ? 0 : N);
        EXPECT_EQ(rd.sent[i], i == root ? 0 : N);
        EXPECT_EQ(bc.sent[i], rd.received[i]);
        EXPECT_LE(bc.sent[i], N);
        sent += bc.sent[i];
      }
      EXPECT_EQ(sent, (w - 1) * N);
      // Binomial broadcast/reduce: the root sends (receives) N per child, i.e.
      // ceil(log2 n)·N; every other rank receives (sends) N once.
      auto bt = run(request({Collective::broadcast, Algorithm::tree}, n, N, 1 << 30, root));
      auto rt = run(request({Collective::reduce, Algorithm::tree}, n, N, 1 << 30, root));
      EXPECT_EQ(bt.sent[root], static_cast<std::uint64_t>(ceil_log2(n)) * N);
      EXPECT_EQ(rt.received[root], static_cast<std::uint64_t>(ceil_log2(n)) * N);
      EXPECT_EQ(bt.messages, w - 1);
      for (int i = 0; i < n; ++i) {
        if (i == root) continue;
        EXPECT_EQ(bt.received[i], N);
        EXPECT_EQ(rt.sent[i], N);
      }
    }
  }
}

TEST(WireBytes, AllreduceAlgorithmsMatchTheDocumentedFormulas) {
  const std::uint64_t N = 32760;  // divisible by 1..10, 12, 13
  for (int n : {2, 3, 4, 5, 6, 7, 8, 9, 12, 13}) {
    const std::uint64_t w = static_cast<std::uint64_t>(n);
    // Recursive halving-doubling: 2(p-1)/p·N each way on the p ranks that stay, plus
    // N each way for the odd ranks of the fold; the even ones move N each way only.
    {
      auto r = run(request({Collective::allreduce, Algorithm::rhd}, n, N, 1 << 30));
      std::uint64_t p = 1;
      while (p * 2 <= w) p *= 2;
      const std::uint64_t rem = w - p;
      for (std::uint64_t i = 0; i < w; ++i) {
        const std::uint64_t want = i < 2 * rem && i % 2 == 0 ? N : 2 * (p - 1) * N / p + (i < 2 * rem ? N : 0);
        EXPECT_EQ(r.sent[i], want) << "rhd n " << n << " rank " << i;
        EXPECT_EQ(r.received[i], want) << "rhd n " << n << " rank " << i;
      }
    }
    // Double binary tree: each tree moves its half over each of its n-1 edges twice
    // (2(n-1)·N in all), and no rank sends or receives more than 2N.
    {
      auto r = run(request({Collective::allreduce, Algorithm::tree}, n, N, 1 << 30));
      EXPECT_EQ(r.bytes, 2 * (w - 1) * N) << "tree n " << n;
      for (std::uint64_t i = 0; i < w; ++i) {
        EXPECT_LE(r.sent[i], 2 * N) << "tree n " << n;
        EXPECT_LE(r.received[i], 2 * N) << "tree n " << n;
      }
    }
    // Hierarchical, L ranks on each of H hosts: 2(L-1)/L·N inside the host and
    // 2(H-1)/H·N/L between hosts, each way.
    for (int per_host : {2, 3, 4}) {
      if (n % per_host || n == per_host) continue;
      const std::uint64_t L = static_cast<std::uint64_t>(per_host), H = w / L;
      auto req = request({Collective::allreduce, Algorithm::hierarchical}, n, N, 1 << 30);
      req.host_of = hosts(n, per_host);
      ASSERT_EQ(build_plan(req)->request.algorithm, Algorithm::hierarchical);
      auto r = run(req);
      for (std::uint64_t i = 0; i < w; ++i) {
        std::uint64_t intra = 0, inter = 0;
        for (std::uint64_t j = 0; j < w; ++j) (i / L == j / L ? intra : inter) += r.traffic[i * w + j];
        EXPECT_EQ(intra, 2 * (L - 1) * N / L) << "hier n " << n << " L " << L;
        EXPECT_EQ(inter, 2 * (H - 1) * N / (H * L)) << "hier n " << n << " L " << L;
      }
    }
  }
}

TEST(WireBytes, DeterministicModeMatchesTheDocumentedFormulas) {
  const std::uint64_t N = 32760, c = 12;
  for (int n : {2, 3, 5, 8, 12, 13}) {
    const std::uint64_t w = static_cast<std::uint64_t>(n);
    // All-reduce: direct reduce-scatter + ring all-gather, 2(n-1)/n·N each way.
    auto ar = run(request({Collective::allreduce, Algorithm::tree, true}, n, N, 1 << 30));
    // Reduce-scatter: (n-1)·count each way, in one round.
    auto rs = run(request({Collective::reduce_scatter, Algorithm::ring, true}, n, c, 1 << 30));
    for (std::uint64_t i = 0; i < w; ++i) {
      EXPECT_EQ(ar.sent[i], 2 * (w - 1) * N / w);
      EXPECT_EQ(ar.received[i], 2 * (w - 1) * N / w);
      EXPECT_EQ(ar.reduced[i], (w - 1) * N / w);
      EXPECT_EQ(rs.sent[i], (w - 1) * c);
      EXPECT_EQ(rs.received[i], (w - 1) * c);
    }
    // Reduce: the rank-order chain moves N per hop, plus one hop to a root that is not
    // the last rank.
    for (int root : {0, n / 2, n - 1}) {
      auto rd = run(request({Collective::reduce, Algorithm::ring, true}, n, N, 1024, root));
      EXPECT_EQ(rd.bytes, (w - 1) * N + (root == n - 1 ? 0 : N)) << n << " root " << root;
      EXPECT_EQ(rd.sent[static_cast<std::size_t>(n - 1)], root == n - 1 ? 0 : N);
    }
  }
}

TEST(PlanDispatch, HierarchicalFallsBackToTheRingWhereItCannotHelp) {
  auto req = request({Collective::allreduce, Algorithm::hierarchical}, 6, 100, 1 << 20);
  EXPECT_EQ(build_plan(req)->request.algorithm, Algorithm::ring);  // no host map
  req.host_of = hosts(6, 6);
  EXPECT_EQ(build_plan(req)->request.algorithm, Algorithm::ring);  // one host
  req.host_of = hosts(6, 1);
  EXPECT_EQ(build_plan(req)->request.algorithm, Algorithm::ring);  // one rank per host
  req.host_of = hosts(6, 4);
  EXPECT_EQ(build_plan(req)->request.algorithm, Algorithm::ring);  // 4 + 2 ranks
  req.host_of = std::make_shared<const std::vector<int>>(std::vector<int>{7, 3, 7, 3, 7, 3});
  EXPECT_EQ(build_plan(req)->request.algorithm, Algorithm::hierarchical);  // interleaved hosts
  EXPECT_TRUE(verify_plans(req, VerifyOptions{}).ok);
}

TEST(TreeShape, NoRankIsAnInnerNodeOfBothTrees) {
  // The point of NCCL's second tree (mirror or shift of the first): a rank's two
  // children are in one tree only, so it reduces at most N (two halves) and talks to at
  // most 4 peers; an inner node of both trees would reduce up to 2N.
  for (int n = 2; n <= 64; ++n) {
    const std::uint64_t N = 2 * static_cast<std::uint64_t>(n);
    auto r = run(request({Collective::allreduce, Algorithm::tree}, n, N, 1 << 30));
    for (int i = 0; i < n; ++i) {
      EXPECT_LE(r.reduced[static_cast<std::size_t>(i)], N) << "n " << n << " rank " << i;
      int peers = 0;
      for (int j = 0; j < n; ++j)
        peers += r.traffic[static_cast<std::size_t>(j * n + i)] + r.traffic[static_cast<std::size_t>(i * n + j)] > 0;
      EXPECT_LE(peers, 4) << "n " << n << " rank " << i;
    }
  }
}

// ---- the verifier catches broken plans of the new kinds ------------------------------

namespace {
PlanBuilder mutated(const std::function<void(Plan&)>& f) {
  return [f](const PlanRequest& req) {
    auto p = std::make_shared<Plan>(*build_plan(req));
    f(*p);
    return std::shared_ptr<const Plan>(p);
  };
}
VerifyResult run_broken(const PlanRequest& req, const std::function<void(Plan&)>& f, bool in_place = false) {
  VerifyOptions o;
  o.in_place = in_place;
  return verify_plans(req, o, mutated(f));
}
/// A mutation for run_broken: `f` on every step of kind `kind` in the plan of `rank`
/// (of every rank with -1).
std::function<void(Plan&)> on_steps(int rank, StepKind kind, std::function<void(Step&)> f) {
  return [rank, kind, f](Plan& p) {
    if (rank != -1 && p.request.rank != rank) return;
    for (auto& s : p.steps)
      if (s.kind == kind) f(s);
  };
}
}  // namespace

TEST(VerifierCatches, MisindexedAlltoall) {
  // Rank 2 sends each peer the block meant for the next rank.
  auto req = request({Collective::alltoall, Algorithm::ring}, 5, 4, 1 << 20);
  auto r = run_broken(req, on_steps(2, StepKind::send, [](Step& s) { s.src.offset = (s.src.offset + 4) % 20; }));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("element"), std::string::npos) << r.error;
}

TEST(VerifierCatches, AllgatherBlocksInTheWrongPlace) {
  // Rank 1 stores the block it receives one block too far.
  auto req = request({Collective::allgather, Algorithm::ring}, 4, 3, 1 << 20);
  auto r = run_broken(req, on_steps(1, StepKind::recv, [](Step& s) {
                        if (s.dst.offset == 0) s.dst.offset = 3;
                      }));
  EXPECT_FALSE(r.ok);
}

TEST(VerifierCatches, ReduceScatterOwnerKeepingTheWrongBlock) {
  // Every rank reduces its last message with its input block shifted by one element.
  auto req = request({Collective::reduce_scatter, Algorithm::ring}, 3, 5, 1 << 20);
  auto r = run_broken(req, on_steps(-1, StepKind::recv_reduce, [](Step& s) {
                        if (s.dst.buf == Buffer::output) s.src.offset += s.src.offset > 0 ? -1 : 1;
                      }));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("with element"), std::string::npos) << r.error;
}

TEST(VerifierCatches, BroadcastReadingANonRootInput) {
  // A non-root forwards its own input instead of what it received.
  auto req = request({Collective::broadcast, Algorithm::ring}, 4, 8, 1 << 20, 1);
  auto r = run_broken(req, on_steps(2, StepKind::send, [](Step& s) { s.src.buf = Buffer::input; }));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("outside its buffer"), std::string::npos) << r.error;
}

TEST(VerifierCatches, ReduceWritingANonRootOutput) {
  auto req = request({Collective::reduce, Algorithm::tree}, 4, 8, 1 << 20, 0);
  auto r = run_broken(req, on_steps(2, StepKind::recv_reduce, [](Step& s) { s.dst.buf = Buffer::output; }));
  EXPECT_FALSE(r.ok);
}

TEST(VerifierCatches, InPlaceAlltoallWithoutParking) {
  // Receive every block straight into the output: out of place that is right, in
  // place it overwrites blocks still to be sent.
  auto req = request({Collective::alltoall, Algorithm::ring}, 4, 2, 1 << 20);
  auto direct = [](Plan& p) {
    const std::uint64_t c = p.request.count, n = static_cast<std::uint64_t>(p.request.world);
    const std::uint64_t r = static_cast<std::uint64_t>(p.request.rank);
    Plan q;
    q.request = p.request;
    q.phase_names = p.phase_names;
    q.add(Step(StepKind::copy, -1, {Buffer::input, r * c, c}, {Buffer::output, r * c, c}));
    for (std::uint64_t k = 1; k < n; ++k) {
      const std::uint64_t to = (r + k) % n, from = (r + n - k) % n;
      q.add(Step(StepKind::send, static_cast<int>(to), {Buffer::input, to * c, c}, {}));
      q.add(Step(StepKind::recv, static_cast<int>(from), {}, {Buffer::output, from * c, c}));
    }
    q.seal();
    p = q;
  };
  EXPECT_TRUE(run_broken(req, direct, false).ok);
  bool caught = false;
  for (std::uint64_t seed = 0; seed < 50 && !caught; ++seed) {
    VerifyOptions o;
    o.in_place = true;
    o.seed = seed;
    caught = !verify_plans(req, o, mutated(direct)).ok;
  }
  EXPECT_TRUE(caught);
}

// The v-collectives: blocks of their own sizes, empty ones included, over worlds 1..16,
// in and out of place (alltoallv in place where its matrix is symmetric), sum, avg and
// premul_sum for reduce_scatter_v, several slicings and interleavings.
TEST(VCollectives, ProvenForRandomBlockSizes) {
  std::mt19937_64 rng(11);
  for (int world = 1; world <= 16; ++world)
    for (int trial = 0; trial < 6; ++trial) {
      const auto n = static_cast<std::size_t>(world);
      auto size = [&] { return rng() % 4 == 0 ? 0 : rng() % 23; };
      auto blocks = std::make_shared<std::vector<std::uint64_t>>(n);
      for (auto& x : *blocks) x = size();
      auto matrix = std::make_shared<std::vector<std::uint64_t>>(n * n);
      const bool symmetric = trial % 2 == 1;
      for (std::size_t a = 0; a < n; ++a)
        for (std::size_t b = 0; b < n; ++b)
          (*matrix)[a * n + b] = symmetric && b < a ? (*matrix)[b * n + a] : size();
      for (Collective c : {Collective::allgatherv, Collective::reduce_scatter_v, Collective::alltoallv})
        for (bool in_place : {false, true}) {
          if (in_place && c == Collective::alltoallv && !symmetric) continue;
          PlanRequest req(c, world, 0, 4,
                          c != Collective::reduce_scatter_v ? ReduceOp::sum
                          : trial % 3 == 0                  ? ReduceOp::avg
                          : trial % 3 == 1                  ? ReduceOp::premul_sum
                                                            : ReduceOp::sum);
          req.algorithm = Algorithm::automatic;
          req.slice_bytes = trial % 2 ? 12 : 1 << 20;
          req.counts = c == Collective::alltoallv ? matrix : blocks;
          if (trial == 5 && world % 4 == 0) req.host_of = hosts(world, 2);
          VerifyOptions o;
          o.in_place = in_place;
          o.seed = static_cast<std::uint64_t>(world * 100 + trial);
          o.rendezvous = trial % 3 != 2;
          o.post_first = trial % 2 == 0;
          const auto r = verify_plans(req, o);
          ASSERT_TRUE(r.ok) << to_string(c) << " world " << world << " trial " << trial
                            << (in_place ? " in place" : "") << ": " << r.error;
        }
    }
}

TEST(VCollectives, RefuseMissingCountsAndDeterministicMode) {
  PlanRequest req(Collective::allgatherv, 3, 0);
  EXPECT_THROW(build_plan(req), braid::Error);
  req.counts = std::make_shared<std::vector<std::uint64_t>>(2, 1);
  EXPECT_THROW(build_plan(req), braid::Error);
  req.collective = Collective::reduce_scatter_v;
  req.counts = std::make_shared<std::vector<std::uint64_t>>(3, 1);
  req.deterministic = true;
  EXPECT_THROW(build_plan(req), braid::Error);
  // A wrong block size in one rank's plan is caught (the message sizes disagree).
  PlanRequest ag(Collective::allgatherv, 4, 0);
  ag.counts = std::make_shared<std::vector<std::uint64_t>>(std::vector<std::uint64_t>{3, 0, 5, 2});
  EXPECT_TRUE(verify_plans(ag, VerifyOptions{}).ok);
  auto r = verify_plans(ag, VerifyOptions{}, [](const PlanRequest& q) {
    PlanRequest wrong = q;
    if (q.rank == 1) wrong.counts = std::make_shared<std::vector<std::uint64_t>>(std::vector<std::uint64_t>{3, 0, 4, 2});
    return build_plan(wrong);
  });
  EXPECT_FALSE(r.ok);
}

TEST(VerifierCatches, PremulSumWithoutItsScaleOrScalingTwice) {
  // premul_sum plans scale each rank's input once, before any reduction. The sum plan run
  // as a premul_sum reduces unscaled contributions; scaling a partial sum (or a scaled
  // copy) again is caught too.
  for (Collective c : {Collective::allreduce, Collective::reduce, Collective::reduce_scatter}) {
    auto req = request({c, Algorithm::ring}, 4, 6, 1 << 20, 0, ReduceOp::premul_sum);
    ASSERT_TRUE(verify_plans(req, VerifyOptions{}).ok) << to_string(c);
    auto unscaled = verify_plans(req, VerifyOptions{}, [](const PlanRequest& q) {
      PlanRequest plain = q;
      plain.op = ReduceOp::sum;
      return build_plan(plain);
    });
    EXPECT_FALSE(unscaled.ok) << to_string(c);
    EXPECT_NE(unscaled.error.find("not scaled"), std::string::npos) << unscaled.error;
    // The first reduction that scales its source gets a scaled copy of it instead.
    auto twice = run_broken(req, [](Plan& p) {
      Plan q;
      q.request = p.request;
      q.scratch_count = p.scratch_count;
      q.phase_names = p.phase_names;
      std::vector<std::uint32_t> moved(p.steps.size());
      bool done = false;
      for (std::size_t i = 0; i < p.steps.size(); ++i) {
        Step s = p.steps[i];
        std::vector<std::uint32_t> deps;
        for (std::uint32_t k = 0; k < s.dep_count; ++k) deps.push_back(moved[p.deps[s.dep_begin + k]]);
        if (!done && s.scale_src) {
          const Region copy{Buffer::scratch, q.scratch_count, s.src.count};
          q.scratch_count += s.src.count;
          deps.push_back(q.add(Step(StepKind::scale, -1, s.src, copy)));
          s.src = copy;
          done = true;
        }
        moved[i] = q.add(s, deps);
      }
      q.seal();
      p = q;
    });
    EXPECT_FALSE(twice.ok) << to_string(c);
    EXPECT_NE(twice.error.find("scaled twice"), std::string::npos) << twice.error;
  }
}

TEST(VerifierCatches, ReductionOutOfRankOrderInDeterministicMode) {
  // The ring's plan run where deterministic mode is asked for: every element holds
  // every contribution, but not folded in rank order, which the verifier reports.
  for (Algorithm a : {Algorithm::ring, Algorithm::tree, Algorithm::rhd}) {
    auto req = request({Collective::allreduce, a, true}, 5, 20, 1 << 20);
    auto r = verify_plans(req, VerifyOptions{}, [a](const PlanRequest& q) {
      PlanRequest plain = q;
      plain.deterministic = false;
      return build_plan(plain);
    });
    EXPECT_FALSE(r.ok) << braid::to_string(a);
    EXPECT_NE(r.error.find("rank order"), std::string::npos) << r.error;
  }
}

// The algorithm table (collectives/algorithms.hpp) is the one menu: every enum value
// but automatic is offered by some collective, names round-trip, build_plan labels
// plans from it, and closed forms exist exactly where the table has one.
TEST(AlgorithmTable, CoversTheEnumAndDrivesDispatch) {
  std::vector<bool> seen(static_cast<std::size_t>(kNumAlgorithms), false);
  for (const AlgorithmRow& row : algorithm_table()) {
    seen[static_cast<std::size_t>(row.algorithm)] = true;
    EXPECT_NE(row.algorithm, Algorithm::automatic);
    EXPECT_NE(row.build, nullptr);
    EXPECT_NE(std::string(row.summary), "");
    EXPECT_EQ(find_algorithm(row.collective, row.algorithm), &row);
    const auto offered = algorithms_for(row.collective);
    EXPECT_NE(std::find(offered.begin(), offered.end(), row.algorithm), offered.end());
    PlanRequest req(row.collective, 4, 10);
    req.algorithm = row.algorithm;
    if (is_v(row.collective))
      req.counts = std::make_shared<std::vector<std::uint64_t>>(row.collective == Collective::alltoallv ? 8 : 4, 10);
    const auto plan = build_plan(req);
    if (plan->request.algorithm == row.algorithm) {  // hierarchical falls back without a host map
      EXPECT_EQ(std::string(plan->name()), row.label ? row.label : std::string(to_string(row.algorithm)));
    }
    LinkCost link{1e-6, 1e-9, false};
    if (row.closed_form)
      EXPECT_GT(closed_form_seconds(row.collective, row.algorithm, 4, 1e6, link, 1e-10), 0.0);
    else
      EXPECT_THROW(closed_form_seconds(row.collective, row.algorithm, 4, 1e6, link, 1e-10), Error);
  }
  for (int a = 1; a < kNumAlgorithms; ++a) {
    EXPECT_TRUE(seen[static_cast<std::size_t>(a)]) << to_string(static_cast<Algorithm>(a)) << " is in no row";
    EXPECT_EQ(parse_algorithm(to_string(static_cast<Algorithm>(a))), static_cast<Algorithm>(a));
  }
  EXPECT_EQ(find_algorithm(Collective::alltoall, Algorithm::tree), nullptr);
}
