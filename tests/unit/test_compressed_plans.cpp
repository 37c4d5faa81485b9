// Compression as plan steps (collectives/compressed.cpp): the symbolic verifier proves
// the compressed all-reduce plans (two-phase, sparse all-gather, hierarchical two-phase)
// for every world of 1..64 ranks, in place and out of place, with and without error
// feedback: every rank ends with the sum of every rank's values, each value quantised
// exactly twice (once for topk), decoded from the same bytes on every rank (bitwise
// identical), avg divided once, every residual element carried into exactly one encode.
// It also shows the verifier rejects compressed plans that break those rules, and that
// the cost model prices the plans: fewer wire bytes, less predicted time on slow links.
#include "collectives/builder.hpp"
#include "collectives/cost.hpp"
#include "collectives/plan.hpp"
#include "collectives/verifier.hpp"
#include "compression/framed.hpp"
#include "compression/reference.hpp"

#include <braid/error.hpp>
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <string>
#include <tuple>

using namespace braid;
using namespace braid::collectives;

namespace {

PlanRequest compressed_request(int world, std::uint64_t count, const char* codec, bool feedback,
                               ReduceOp op = ReduceOp::sum) {
  PlanRequest req(Collective::allreduce, world, count, 4, op);
  req.algorithm = Algorithm::automatic;
  req.codec = compression::parse_codec(codec);
  req.feedback = feedback;
  return req;
}

std::shared_ptr<const std::vector<int>> hosts(int world, int per_host) {
  auto h = std::make_shared<std::vector<int>>(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) (*h)[static_cast<std::size_t>(r)] = r / per_host;
  return h;
}

}  // namespace

TEST(CompressedPlans, TwoPhaseAndSparseAreProvedForEveryWorldUpTo64) {
  // block=8: frames of 8 values keep the symbolic packed buffers small at 64 ranks.
  for (int world = 1; world <= 64; ++world) {
    const std::uint64_t w = static_cast<std::uint64_t>(world);
    for (const char* codec : {"int8:block=8", "topk:0.5"}) {
      for (std::uint64_t count : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{7}, w + 3, 3 * w + 2}) {
        const bool feedback = (count + w) % 2 == 0;
        const ReduceOp op = (count / 2 + w) % 2 == 0 ? ReduceOp::avg : ReduceOp::sum;
        const bool in_place = world % 3 == 0;
        const auto r = verify_plans(compressed_request(world, count, codec, feedback, op), in_place, w * 7 + count);
        ASSERT_TRUE(r.ok) << codec << " world " << world << " count " << count << " feedback " << feedback
                          << " in_place " << in_place << ": " << r.error;
      }
    }
  }
}

TEST(CompressedPlans, EveryCombinationOnSmallWorlds) {
  for (int world : {1, 2, 3, 4, 5}) {
    for (const char* codec : {"fp16", "int8:block=8", "sign1:block=16", "topk:0.3"}) {
      for (std::uint64_t count : {std::uint64_t{1}, std::uint64_t{19}, std::uint64_t{300}}) {
        for (bool feedback : {false, true})
          for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg})
            for (bool in_place : {false, true})
              for (bool rendezvous : {false, true}) {
                VerifyOptions o;
                o.in_place = in_place;
                o.rendezvous = rendezvous;
                o.seed = count * 31 + static_cast<std::uint64_t>(world);
                const auto r = verify_plans(compressed_request(world, count, codec, feedback, op), o);
                ASSERT_TRUE(r.ok) << codec << " world " << world << " count " << count << " feedback "
                                  << feedback << " " << to_string(op) << " in_place " << in_place << ": " << r.error;
              }
      }
    }
  }
}

// Shards of more than one piece (kMinPiece = 64 Ki values): the pipelined order
// E0 A0 | E1 A1 O0 G0 | ... is proved too, with frames of several per piece.
TEST(CompressedPlans, PipelinedPiecesAreProved) {
  const auto plan = build_plan(compressed_request(2, 300000, "int8", true, ReduceOp::avg));
  EXPECT_EQ(plan->label, std::string("two-phase"));
  EXPECT_EQ(plan->packed_frame, 8192u);
  EXPECT_EQ(plan->feedback_count[0], 300000u);
  EXPECT_EQ(plan->feedback_count[1], 150000u);
  for (bool in_place : {false, true}) {
    const auto r = verify_plans(compressed_request(2, 300000, "int8", true, ReduceOp::avg), in_place, 3);
    ASSERT_TRUE(r.ok) << r.error;
  }
}

// On a device each codec step is one launch whatever its size, so the owner works whole
// pieces there (W decodes and an encode per piece, not per ~8 Ki-value frame). The plans
// are proved alike, and their messages are the host plans' in the same order: a rank on
// the device path and one on the host path still match.
TEST(CompressedPlans, DevicePlansWorkWholePiecesWithTheSameMessages) {
  for (int world : {2, 3}) {
    const std::uint64_t n = 300000;
    PlanRequest host = compressed_request(world, n, "int8", true, ReduceOp::avg), dev = host;
    dev.on_device = true;
    for (bool in_place : {false, true}) {
      const auto r = verify_plans(dev, in_place, 5);
      ASSERT_TRUE(r.ok) << "world " << world << ": " << r.error;
    }
    for (int rank = 0; rank < world; ++rank) {
      host.rank = dev.rank = rank;
      const auto hp = build_plan(host), dp = build_plan(dev);
      auto messages = [](const Plan& p) {
        std::vector<std::tuple<int, int, int, std::uint64_t, std::uint64_t>> m;
        for (const Step& s : p.steps)
          if (!is_local(s.kind)) {
            const Region& r = s.kind == StepKind::send ? s.src : s.dst;
            m.emplace_back(static_cast<int>(s.kind), s.peer, static_cast<int>(r.buf), r.offset, r.count);
          }
        return m;
      };
      EXPECT_EQ(messages(*hp), messages(*dp)) << "rank " << rank;
      EXPECT_EQ(hp->packed_count, dp->packed_count);
      auto owner_steps = [](const Plan& p) {
        std::uint64_t k = 0;
        for (const Step& s : p.steps) k += std::string(p.phase_names[s.phase]) == "owner sum";
        return k;
      };
      // Pieces of 64 Ki values, 8 frames each (the shard of 100-150 K values is 2-3 pieces).
      const std::uint64_t pieces = (n / static_cast<std::uint64_t>(world) + 65535) / 65536;
      EXPECT_EQ(owner_steps(*dp), pieces * static_cast<std::uint64_t>(world + 1)) << "rank " << rank;
      EXPECT_GT(owner_steps(*hp), 4 * owner_steps(*dp)) << "rank " << rank;
    }
  }
}

TEST(CompressedPlans, HierarchicalCompressesOnlyBetweenHosts) {
  struct Layout {
    int world, per_host;
  };
  for (const Layout l : {Layout{4, 2}, Layout{6, 3}, Layout{12, 4}, Layout{32, 8}, Layout{64, 8}}) {
    for (std::uint64_t count : {std::uint64_t{1}, std::uint64_t{5}, std::uint64_t{97}}) {
      for (bool feedback : {false, true}) {
        auto req = compressed_request(l.world, count, "int8:block=8", feedback, feedback ? ReduceOp::avg : ReduceOp::sum);
        req.host_of = hosts(l.world, l.per_host);
        const auto plan = build_plan(req);
        ASSERT_EQ(plan->label, std::string("hierarchical two-phase"));
        const auto r = verify_plans(req, count % 2 == 1, count);
        ASSERT_TRUE(r.ok) << l.world << "/" << l.per_host << " count " << count << ": " << r.error;
        // Packed (compressed) messages only between hosts; values only inside a host.
        for (int rank = 0; rank < l.world; ++rank) {
          req.rank = rank;
          const auto p = build_plan(req);
          for (const Step& s : p->steps) {
            if (s.kind != StepKind::send) continue;
            const bool cross = s.peer / l.per_host != rank / l.per_host;
            EXPECT_EQ(cross, s.src.buf == Buffer::packed) << "rank " << rank << " to " << s.peer;
          }
        }
      }
    }
  }
  // topk and layouts without the structure stay flat.
  auto req = compressed_request(4, 10, "topk:0.5", true);
  req.host_of = hosts(4, 2);
  EXPECT_EQ(build_plan(req)->label, std::string("sparse all-gather"));
  req = compressed_request(4, 10, "fp16", false);
  req.host_of = hosts(4, 4);
  EXPECT_EQ(build_plan(req)->label, std::string("two-phase"));
}

TEST(CompressedPlans, RequestsOutsideTheAlgorithmAreRefused) {
  auto req = compressed_request(2, 10, "int8", false);
  req.algorithm = Algorithm::ring;
  EXPECT_THROW(build_plan(req), Error);
  req = compressed_request(2, 10, "int8", false, ReduceOp::max);
  EXPECT_THROW(build_plan(req), Error);
  req = compressed_request(2, 10, "int8", false);
  req.collective = Collective::allgather;
  EXPECT_THROW(build_plan(req), Error);
  req = compressed_request(2, 10, "int8", false);
  req.deterministic = true;
  EXPECT_THROW(build_plan(req), Error);
}

// --- the verifier rejects compressed plans that break the rules -------------------

namespace {

// A plan built by build_plan, then changed by `edit` on rank `who`.
PlanBuilder edited(int who, std::function<void(Plan&)> edit) {
  return [who, edit](const PlanRequest& r) {
    auto p = std::make_shared<Plan>(*build_plan(r));
    if (r.rank == who) edit(*p);
    return std::shared_ptr<const Plan>(p);
  };
}

}  // namespace

TEST(CompressedPlans, VerifierCatchesAThirdQuantisation) {
  // The owner re-encodes its sum once more before the all-gather: decode(encode(...))
  // of its own payload into scratch and encode again (three quantisations).
  auto req = compressed_request(2, 16, "int8:block=8", false);
  const auto r = verify_plans(req, VerifyOptions{}, [](const PlanRequest& q) {
    auto p = std::make_shared<Plan>();
    p->request = q;
    Builder b(*p);
    p->packed_frame = 8;
    const std::uint64_t n = q.count, half = n / 2, mine = static_cast<std::uint64_t>(q.rank) * half;
    const int other = 1 - q.rank;
    const std::uint64_t out_slot = b.packed(half), in_own = b.packed(half), in_other = b.packed(half),
                        red_own = b.packed(half), red_other = b.packed(half), red2 = b.packed(half);
    const std::uint64_t acc = b.scratch(half), acc2 = b.scratch(half);
    const auto ph = b.phase("x");
    const std::uint64_t theirs = static_cast<std::uint64_t>(other) * half;
    b.encode({Buffer::input, theirs, half}, {}, {Buffer::packed, out_slot, half}, 0, q.rank, theirs, ph);
    b.encode({Buffer::input, mine, half}, {}, {Buffer::packed, in_own, half}, 0, q.rank, mine, ph);
    b.send(other, {Buffer::packed, out_slot, half}, ph);
    b.recv(other, {Buffer::packed, in_other, half}, ph);
    const Region first{Buffer::packed, q.rank == 0 ? in_own : in_other, half};
    const Region second{Buffer::packed, q.rank == 0 ? in_other : in_own, half};
    b.decode(first, {Buffer::scratch, acc, half}, ph, true);
    b.decode_add(second, {Buffer::scratch, acc, half}, ph);
    b.encode({Buffer::scratch, acc, half}, {}, {Buffer::packed, red2, half}, 1, q.rank, mine, ph);
    b.decode({Buffer::packed, red2, half}, {Buffer::scratch, acc2, half}, ph, false);
    b.encode({Buffer::scratch, acc2, half}, {}, {Buffer::packed, red_own, half}, 1, q.rank, mine, ph);
    b.send(other, {Buffer::packed, red_own, half}, ph);
    b.recv(other, {Buffer::packed, red_other, half}, ph);
    b.decode({Buffer::packed, red_own, half}, {Buffer::output, mine, half}, ph, false);
    b.decode({Buffer::packed, red_other, half}, {Buffer::output, theirs, half}, ph, false);
    p->seal();
    return std::shared_ptr<const Plan>(p);
  });
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.error.find("quantised 3 times"), std::string::npos) << r.error;
}

TEST(CompressedPlans, VerifierCatchesAnOwnerThatKeepsItsUnencodedSum) {
  // Rank 1 writes its own shard's output from its f32 accumulator instead of decoding
  // the bytes it sent to the others: its result is not theirs, bit for bit.
  auto req = compressed_request(2, 16, "int8:block=8", false);
  const auto r = verify_plans(req, VerifyOptions{}, edited(1, [](Plan& p) {
    std::uint64_t acc_offset = 0;
    for (const Step& s : p.steps)
      if (s.kind == StepKind::encode && s.src.buf == Buffer::scratch) acc_offset = s.src.offset;
    for (Step& s : p.steps)
      if (s.kind == StepKind::decode && s.dst.buf == Buffer::output && s.dst.offset == 8) {
        s.kind = StepKind::copy;
        s.src = Region{Buffer::scratch, acc_offset, s.dst.count};
      }
  }));
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.error.find("bitwise identical"), std::string::npos) << r.error;
}

TEST(CompressedPlans, VerifierCatchesResidualsNotCarriedExactlyOnce) {
  auto req = compressed_request(3, 30, "int8:block=8", true);
  const auto r = verify_plans(req, VerifyOptions{}, edited(2, [](Plan& p) {
    for (Step& s : p.steps)
      if (s.kind == StepKind::encode && s.src2.buf == Buffer::feedback_owner) {
        s.src2 = Region{};  // this encode forgets the owner's residual
        break;
      }
  }));
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.error.find("owner residual"), std::string::npos) << r.error;
}

TEST(CompressedPlans, VerifierCatchesUnalignedPackedRegions) {
  auto req = compressed_request(2, 40, "int8:block=8", false);
  const auto r = verify_plans(req, VerifyOptions{}, [](const PlanRequest& q) {
    auto p = std::make_shared<Plan>(*build_plan(q));
    for (Step& s : p->steps)
      if (s.kind == StepKind::encode) {
        s.dst.offset += 1;
        break;
      }
    return std::shared_ptr<const Plan>(p);
  });
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.error.find("aligned"), std::string::npos) << r.error;
}

// --- the cost model prices compressed plans ------------------------------------------

TEST(CompressedPlans, CostModelPricesTheCodecsBytes) {
  CostModel m;
  m[LinkClass::shm] = {1e-6, 1e-10};
  m[LinkClass::tcp] = {50e-6, 8e-9};  // 125 MB/s: a 1 Gbit/s link
  m.gamma = 1e-10;
  m.copy_beta = 1e-10;
  const auto topo = Topology::hosts(4, 1, LinkClass::shm, LinkClass::tcp);
  const std::uint64_t count = 4 << 20;  // 16 MiB of f32
  const PlanRequest plain(Collective::allreduce, 4, count);  // ring
  const Prediction none = simulate(plain, topo, m);
  const Prediction fp16 = simulate(compressed_request(4, count, "fp16", false), topo, m);
  const Prediction int8 = simulate(compressed_request(4, count, "int8", true), topo, m);
  const Prediction sign1 = simulate(compressed_request(4, count, "sign1", true), topo, m);
  // Wire bytes are the codec's (compression::wire_bytes_per_rank), summed over ranks.
  for (const auto& [pred, codec] : {std::pair{fp16, "fp16"}, std::pair{int8, "int8"}, std::pair{sign1, "sign1"}}) {
    double want = 0;
    for (int r = 0; r < 4; ++r)
      want += static_cast<double>(compression::wire_bytes_per_rank(compression::parse_codec(codec), count, 4, r));
    // Pieces are framed (a frame's scale blocks start at the frame): at most a few
    // bytes per frame more than whole-shard payloads.
    EXPECT_NEAR(pred.wire_bytes, want, want * 0.01) << codec;
  }
  EXPECT_LT(fp16.seconds, 0.6 * none.seconds);
  EXPECT_LT(int8.seconds, 0.6 * fp16.seconds);
  EXPECT_LT(sign1.seconds, 0.5 * int8.seconds);
}
