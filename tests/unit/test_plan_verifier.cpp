// Proves the ring all-reduce plan with the symbolic verifier for world sizes 1..64
// and awkward counts, and shows the verifier rejects broken plans.
#include "collectives/plan.hpp"
#include "collectives/verifier.hpp"

#include <braid/error.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

using namespace braid;
using namespace braid::collectives;

namespace {

PlanRequest ring_request(int world, std::uint64_t count, std::size_t slice_bytes, ReduceOp op = ReduceOp::sum) {
  PlanRequest req(Collective::allreduce, world, count, 4, op);
  req.algorithm = Algorithm::ring;
  req.slice_bytes = slice_bytes;
  return req;
}

}  // namespace

// Every world size 1..64, counts 0, 1, primes, below/above/not divisible by world,
// with slices small enough that chunks are pipelined in several slices.
TEST(RingVerifier, ProvesAllWorldSizesAndAwkwardCounts) {
  for (int world = 1; world <= 64; ++world) {
    const std::uint64_t counts[] = {0, 1, 2, 7, 13, static_cast<std::uint64_t>(world) - 1 + 1,
                                    static_cast<std::uint64_t>(world) + 1, 97, 3ull * world + 2};
    for (std::uint64_t count : counts) {
      // Small worlds get every combination; large ones alternate the buffer layout to
      // keep the run short (each combination is still covered by some world).
      for (std::size_t slice : {4ul, 12ul, 1ul << 20}) {
        if (slice == 12 && world > 16) continue;
        for (bool in_place : {false, true}) {
          if (world > 16 && in_place != ((count + slice) % 2 == 1)) continue;
          const auto r = verify_plans(ring_request(world, count, slice), in_place, world * 131 + count);
          ASSERT_TRUE(r.ok) << "world " << world << " count " << count << " slice " << slice
                            << " in_place " << in_place << ": " << r.error;
        }
      }
    }
  }
}

TEST(RingVerifier, AvgIsFinalizedExactlyOnce) {
  for (int world : {1, 2, 3, 5, 8, 17}) {
    for (std::uint64_t count : {1ul, 11ul, 64ul}) {
      const auto r = verify_plans(ring_request(world, count, 8, ReduceOp::avg), false, 7);
      ASSERT_TRUE(r.ok) << world << " " << count << ": " << r.error;
    }
  }
}

TEST(RingVerifier, ManyInterleavingsOfOneLayout) {
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    const auto r = verify_plans(ring_request(5, 23, 8), seed % 2 == 0, seed);
    ASSERT_TRUE(r.ok) << "seed " << seed << ": " << r.error;
  }
}

TEST(RingVerifier, WireVolumeIsTwoNMinusOneOverN) {
  // Each rank sends 2(n-1)/n of the vector: n ranks send 2(n-1) * count elements.
  const int n = 6;
  const std::uint64_t count = 600;
  const auto r = verify_plans(ring_request(n, count, 1 << 20), false, 1);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.bytes, 2ull * (n - 1) * count);
  EXPECT_EQ(r.messages, 2ull * (n - 1) * n);
}

TEST(RingVerifier, PlansAreDeterministicAndNamePeers) {
  auto a = build_plan([] { auto r = ring_request(4, 1000, 64); r.rank = 2; return r; }());
  auto b = build_plan([] { auto r = ring_request(4, 1000, 64); r.rank = 2; return r; }());
  ASSERT_EQ(a->steps.size(), b->steps.size());
  EXPECT_EQ(a->describe(), b->describe());
  EXPECT_EQ(a->peers, (std::vector<int>{1, 3}));
}

TEST(PlanDispatch, AlgorithmsACollectiveDoesNotOfferAreRefused) {
  auto req = ring_request(4, 10, 64);
  req.collective = Collective::allgather;
  req.algorithm = Algorithm::tree;
  try {
    build_plan(req);
    FAIL() << "allgather has no tree";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Unsupported);
    EXPECT_NE(std::string(e.what()).find("tree"), std::string::npos);
  }
  req.algorithm = static_cast<Algorithm>(200);
  EXPECT_THROW(build_plan(req), Error);
}

// The verifier must be able to fail: feed it deliberately broken ring plans.
namespace {
std::shared_ptr<const Plan> mutate(const PlanRequest& req, const std::function<void(Plan&)>& f) {
  auto p = std::make_shared<Plan>(*build_plan(req));
  f(*p);
  return p;
}
VerifyResult run_broken(const std::function<void(Plan&)>& f, int world = 4, std::uint64_t count = 40) {
  return verify_plans(ring_request(world, count, 1 << 20), false, 3,
                      [&](const PlanRequest& r) { return mutate(r, f); });
}
}  // namespace

TEST(Verifier, CatchesDoubleCounting) {
  // Rank 1 reduces into its output from its output instead of its input at the
  // last reduce-scatter step, which re-adds a partial sum.
  auto r = run_broken([](Plan& p) {
    if (p.request.rank != 1) return;
    for (auto& s : p.steps)
      if (s.kind == StepKind::recv_reduce) s.src.buf = Buffer::output;
  });
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("rank 1"), std::string::npos) << r.error;
}

TEST(Verifier, CatchesMissingStep) {
  auto r = run_broken([](Plan& p) {
    if (p.request.rank == 2) p.steps.pop_back();
  });
  EXPECT_FALSE(r.ok);
}

TEST(Verifier, CatchesSizeMismatch) {
  auto r = run_broken([](Plan& p) {
    if (p.request.rank == 0) p.steps[0].src.count -= 1;
  });
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("elements"), std::string::npos) << r.error;
}

TEST(Verifier, CatchesDeadlock) {
  // Every rank waits for its first receive before its first send: a cycle around
  // the ring. (Swap the ring's first two steps, send and recv_reduce, and make the
  // send depend on the receive.)
  auto r = run_broken([](Plan& p) {
    ASSERT_EQ(p.steps[0].kind, StepKind::send);
    ASSERT_EQ(p.steps[1].kind, StepKind::recv_reduce);
    std::swap(p.steps[0], p.steps[1]);
    for (auto& d : p.deps)
      if (d <= 1) d = 1 - d;
    p.steps[1].dep_begin = static_cast<std::uint32_t>(p.deps.size());
    p.steps[1].dep_count = 1;
    p.deps.push_back(0);
  });
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("deadlock"), std::string::npos) << "error: " << r.error;
}

TEST(Verifier, CatchesRaceOnInPlaceBuffer) {
  // Drop the all-gather receives' dependencies on this rank's own sends of the same
  // slice: with aliased buffers some interleaving lets a receive overwrite data that
  // is still being sent, which the verifier reports.
  bool caught = false;
  for (std::uint64_t seed = 0; seed < 500 && !caught; ++seed) {
    auto r = verify_plans(ring_request(3, 9, 1 << 20), true, seed, [](const PlanRequest& req) {
      return mutate(req, [](Plan& p) {
        for (auto& s : p.steps)
          if (s.kind == StepKind::recv) s.dep_count = 0;
      });
    });
    caught = !r.ok;
  }
  EXPECT_TRUE(caught);
}

TEST(Verifier, RejectsImpossibleWorld) {
  auto r = verify_plans(ring_request(65, 10, 64), false, 0);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("1..64"), std::string::npos);
}

// The generalized verifier tracks each element's index and reduction shape.
namespace {
// A hand-written plan: `f` fills the steps of one rank.
PlanBuilder hand_built(const std::function<void(const PlanRequest&, Plan&)>& f) {
  return [f](const PlanRequest& req) {
    auto p = std::make_shared<Plan>();
    p->request = req;
    p->phase_names = {"hand-built"};
    f(req, *p);
    p->seal();
    return std::shared_ptr<const Plan>(p);
  };
}
}  // namespace

TEST(Verifier, CatchesReducingDifferentElements) {
  // Rank 0 reduces its input shifted by one element into the message it receives.
  auto r = run_broken([](Plan& p) {
    if (p.request.rank != 0) return;
    for (auto& s : p.steps)
      if (s.kind == StepKind::recv_reduce && s.src.offset > 0) {
        s.src.offset -= 1;
        break;
      }
  });
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("with element"), std::string::npos) << r.error;
}

TEST(Verifier, CatchesResultsThatDifferBetweenRanks) {
  // Every rank sums all inputs itself, starting with its own: the sets are right on
  // every rank but the rounding order differs, so results would not be bitwise equal.
  const int n = 3;
  PlanRequest req = ring_request(n, 5, 1 << 20);
  auto builder = hand_built([](const PlanRequest& q, Plan& p) {
    const Region in{Buffer::input, 0, q.count}, out{Buffer::output, 0, q.count};
    for (int k = 1; k < q.world; ++k) p.add(Step(StepKind::send, (q.rank + k) % q.world, in, {}));
    std::uint32_t last = kNoStep;
    for (int k = 1; k < q.world; ++k)
      last = p.add(Step(StepKind::recv_reduce, (q.rank + q.world - k) % q.world, k == 1 ? in : out, out), {last});
  });
  auto r = verify_plans(req, false, 1, builder);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("bitwise identical"), std::string::npos) << r.error;
}

TEST(Verifier, RendezvousCatchesPlansThatNeedEagerSends) {
  // Two ranks swap blocks (alltoall) but each receives only after its own send has
  // completed: fine if sends complete into a buffer, a deadlock when a send waits for
  // its receive to be posted (the engine over TCP).
  const PlanRequest req(Collective::alltoall, 2, 3);
  auto builder = hand_built([](const PlanRequest& q, Plan& p) {
    const std::uint64_t c = q.count, me = static_cast<std::uint64_t>(q.rank), other = 1 - me;
    p.add(Step(StepKind::copy, -1, {Buffer::input, me * c, c}, {Buffer::output, me * c, c}));
    const auto s = p.add(Step(StepKind::send, static_cast<int>(other), {Buffer::input, other * c, c}, {}));
    p.add(Step(StepKind::recv, static_cast<int>(other), {}, {Buffer::output, other * c, c}), {s});
  });
  VerifyOptions eager;
  eager.rendezvous = false;
  EXPECT_TRUE(verify_plans(req, eager, builder).ok);
  auto r = verify_plans(req, VerifyOptions{}, builder);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("deadlock"), std::string::npos) << r.error;
}

TEST(Verifier, ModelsTheEnginesStagingBuffers) {
  // In place, rank 1 posts two receive-and-reduce steps from rank 0 early; each holds
  // a staging buffer until its message is in. Rank 0 sends those messages only after a
  // token that rank 1 sends once a third in-place receive-and-reduce (from rank 2) is
  // done. With two staging buffers that receive can never be posted: a deadlock the
  // engine would hit. With more buffers the plan runs (and fails only because it is not
  // a complete all-reduce).
  PlanRequest req = ring_request(3, 4, 1 << 20);
  auto builder = hand_built([](const PlanRequest& q, Plan& p) {
    auto out = [](std::uint64_t i, std::uint64_t c) { return Region{Buffer::output, i, c}; };
    auto in = [](std::uint64_t i, std::uint64_t c) { return Region{Buffer::input, i, c}; };
    p.scratch_count = 1;
    if (q.rank == 0) {
      const auto token = p.add(Step(StepKind::recv, 1, {}, {Buffer::scratch, 0, 1}));
      p.add(Step(StepKind::send, 1, in(0, 1), {}), {token});
      p.add(Step(StepKind::send, 1, in(1, 1), {}), {token});
    } else if (q.rank == 2) {
      p.add(Step(StepKind::send, 1, in(2, 2), {}));
    } else {
      p.add(Step(StepKind::recv_reduce, 0, out(0, 1), out(0, 1)));
      p.add(Step(StepKind::recv_reduce, 0, out(1, 1), out(1, 1)));
      const auto third = p.add(Step(StepKind::recv_reduce, 2, out(2, 2), out(2, 2)));
      p.add(Step(StepKind::send, 0, out(2, 1), {}), {third});
    }
  });
  // The deadlock needs both early receives posted before the third one: the random
  // interleavings find it (the engine, which posts peer by peer, always would).
  VerifyOptions opt;
  opt.in_place = true;
  int deadlocks[2] = {0, 0};
  for (std::size_t slots : {2, 3}) {
    opt.staging_slots = slots;
    for (std::uint64_t seed = 0; seed < 50; ++seed) {
      opt.seed = seed;
      auto r = verify_plans(req, opt, builder);
      ASSERT_FALSE(r.ok);
      if (r.error.find("deadlock") != std::string::npos) {
        EXPECT_NE(r.error.find("staging"), std::string::npos) << r.error;
        ++deadlocks[slots - 2];
      } else {
        EXPECT_NE(r.error.find("output element"), std::string::npos) << r.error;
      }
    }
  }
  EXPECT_GT(deadlocks[0], 0);
  EXPECT_EQ(deadlocks[1], 0);
}
