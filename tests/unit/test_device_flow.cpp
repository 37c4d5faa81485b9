// The device path's stream order (core::flow_order): each rank's program is enqueued
// whole at call time, one step after another on one stream, and a receive is a stream
// wait. These tests run every rank's program symbolically (core::flows_complete) for every
// plan braid builds, so that no order can leave ranks waiting on each other where the host
// engine, which waits on all receives at once, would finish.
#include "collectives/algorithms.hpp"
#include "collectives/plan.hpp"
#include "compression/codec.hpp"
#include "core/device_flow.hpp"

#include <braid/error.hpp>
#include <gtest/gtest.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

using namespace braid;
using namespace braid::collectives;

namespace {

std::shared_ptr<const std::vector<int>> hosts(int world, int per_host) {
  auto h = std::make_shared<std::vector<int>>();
  for (int r = 0; r < world; ++r) h->push_back(r / per_host);
  return h;
}

/// Every rank's plan of `req` (req.rank varies), run through flows_complete; "" or why not.
std::string run_all(PlanRequest req) {
  std::vector<std::shared_ptr<const Plan>> held;
  std::vector<const Plan*> plans;
  for (int r = 0; r < req.world; ++r) {
    req.rank = r;
    held.push_back(build_plan(req));
    plans.push_back(held.back().get());
  }
  std::string why;
  if (core::flows_complete(plans, &why)) return {};
  std::ostringstream os;
  os << to_string(req.collective) << "/" << braid::to_string(req.algorithm)
     << (req.deterministic ? " deterministic" : "") << (req.host_of ? " hosts" : "")
     << (req.codec.kind != compression::CodecKind::none ? " codec " + compression::name(req.codec) : std::string())
     << " world " << req.world << " count " << req.count << " slice " << req.slice_bytes << " root " << req.root
     << ": " << why;
  return os.str();
}

bool rooted(Collective c) { return c == Collective::broadcast || c == Collective::reduce; }

}  // namespace

TEST(DeviceFlowOrder, EveryPlanEveryWorldFinishesWithStreamWaits) {
  // Small slices pipeline each chunk in several messages, so that the order of sends and
  // waits matters; worlds up to 12 plus a few large ones, hosts of 2-4 ranks for the
  // topology-aware plans.
  const std::vector<Collective> collectives = {Collective::allreduce, Collective::broadcast, Collective::reduce,
                                               Collective::allgather, Collective::reduce_scatter, Collective::alltoall};
  int cases = 0;
  for (Collective c : collectives)
    for (Algorithm a : algorithms_for(c))
      for (int world : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 24}) {
        for (bool with_hosts : {false, true})
          for (bool deterministic : {false, true}) {
            if (deterministic && c != Collective::allreduce && c != Collective::reduce &&
                c != Collective::reduce_scatter)
              continue;
            for (std::uint64_t count : {1ull, 7ull, 3ull * static_cast<unsigned>(world) + 2, 1000ull}) {
              PlanRequest req(c, world, count, 4, ReduceOp::sum);
              req.algorithm = a;
              req.slice_bytes = 64;
              req.deterministic = deterministic;
              if (with_hosts) req.host_of = hosts(world, world % 4 == 0 ? 4 : world % 3 == 0 ? 3 : 2);
              for (int root : rooted(c) ? std::vector<int>{0, world - 1} : std::vector<int>{0}) {
                req.root = root;
                const std::string why = run_all(req);
                ASSERT_TRUE(why.empty()) << why;
                ++cases;
              }
            }
          }
      }
  EXPECT_GT(cases, 1000);
}

TEST(DeviceFlowOrder, CompressedPlansFinishWithStreamWaits) {
  for (const char* codec : {"fp16", "int8:block=8", "sign1:block=16", "topk:0.3"})
    for (int world : {2, 3, 4, 5, 8, 12})
      for (bool with_hosts : {false, true})
        for (bool feedback : {false, true}) {
          PlanRequest req(Collective::allreduce, world, 1000, 4, ReduceOp::sum);
          req.algorithm = Algorithm::automatic;
          req.codec = compression::parse_codec(codec);
          req.feedback = feedback;
          req.slice_bytes = 256;
          if (with_hosts) req.host_of = hosts(world, 2);
          const std::string why = run_all(req);
          ASSERT_TRUE(why.empty()) << why;
        }
}

TEST(DeviceFlowOrder, SendsThatNeedNoReceiveGoBeforeTheFirstWait) {
  // Ring all-reduce at 4 ranks: the rank's first send of every slice of its own chunk needs
  // nothing received, so all of them come before the stream first waits.
  PlanRequest req(Collective::allreduce, 4, 4000, 4, ReduceOp::sum);
  req.algorithm = Algorithm::ring;
  req.slice_bytes = 1024;
  req.rank = 1;
  const auto plan = build_plan(req);
  const auto order = core::flow_order(*plan);
  ASSERT_EQ(order.size(), plan->steps.size());
  std::size_t first_wait = order.size();
  for (std::size_t k = 0; k < order.size() && first_wait == order.size(); ++k)
    if (!is_local(plan->steps[order[k]].kind) && plan->steps[order[k]].kind != StepKind::send) first_wait = k;
  ASSERT_LT(first_wait, order.size());
  for (std::size_t k = first_wait; k < order.size(); ++k) {
    const Step& s = plan->steps[order[k]];
    if (s.kind != StepKind::send) continue;
    EXPECT_GT(s.dep_count, 0u) << "send step " << order[k] << " depends on nothing but comes after a wait";
  }
}

TEST(DeviceFlowOrder, ADeadlockIsReportedNamingTheRanks) {
  // Two ranks that each receive before they send: the stream programs wait on each other.
  Plan a, b;
  a.request.world = b.request.world = 2;
  a.request.rank = 0;
  b.request.rank = 1;
  a.phase_names = b.phase_names = {"exchange"};
  a.peers = {1};
  b.peers = {0};
  const Region r{Buffer::output, 0, 4};
  // recv then send, the send depending on the recv.
  for (Plan* p : {&a, &b}) {
    const int peer = p == &a ? 1 : 0;
    p->steps.push_back(Step(StepKind::recv, peer, {}, r));
    p->steps.push_back(Step(StepKind::send, peer, r, {}));
    p->deps.push_back(0);
    p->steps[1].dep_begin = 0;
    p->steps[1].dep_count = 1;
  }
  std::string why;
  EXPECT_FALSE(core::flows_complete({&a, &b}, &why));
  EXPECT_NE(why.find("rank 0 waits at step 0"), std::string::npos) << why;
  EXPECT_NE(why.find("rank 1 waits at step 0"), std::string::npos) << why;
}
