// core::staging_need: the receive buffers an operation reserves for its in-place
// receive-and-reduces, with its scratch. Held by the engine across operations they grew,
// slot by slot, to the largest message each had staged, as often as past receives
// happened to overlap in time (tests/soak, docs/reliability.md "Soak"); reserved per
// call they are a function of the call, bounded by kMaxStaging slots of its largest
// staged message, and nothing at all out of place.
#include "collectives/plan.hpp"
#include "core/engine.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace {

using braid::Algorithm;
using braid::collectives::Buffer;
using braid::collectives::build_plan;
using braid::collectives::Collective;
using braid::collectives::Plan;
using braid::collectives::PlanRequest;
using braid::collectives::StepKind;
using braid::core::kMaxStaging;
using braid::core::lands_in_staging;
using braid::core::staging_need;

constexpr int kWorld = 4;

PlanRequest request(Collective c, Algorithm a, int rank, std::uint64_t count,
                    std::size_t slice_bytes = PlanRequest{}.slice_bytes) {
  PlanRequest r(c, kWorld, count, 4);
  r.algorithm = a;
  r.rank = rank;
  r.slice_bytes = slice_bytes;
  return r;
}

// The receive-and-reduces of `plan` whose dst overlaps their src on these buffers, found
// by addresses (the library's buffers each at an address of its own, away from the
// caller's), and the largest of their messages.
struct Counted {
  std::size_t steps = 0, largest = 0;
};
Counted count_staged(const Plan& plan, const std::byte* in, const std::byte* out) {
  const auto at = [&](const braid::collectives::Region& r) {  // as integers: the library's are not real
    const std::uintptr_t base = r.buf == Buffer::input    ? reinterpret_cast<std::uintptr_t>(in)
                                : r.buf == Buffer::output ? reinterpret_cast<std::uintptr_t>(out)
                                                          : (std::uintptr_t{1} << 60) +
                                                                (static_cast<std::uintptr_t>(r.buf) << 48);
    return base + r.offset * 4;
  };
  Counted c;
  for (const auto& s : plan.steps) {
    const bool overlap = at(s.dst) < at(s.src) + s.src.count * 4 && at(s.src) < at(s.dst) + s.dst.count * 4;
    EXPECT_EQ(lands_in_staging(s, 4, in, out), s.kind == StepKind::recv_reduce && overlap);
    if (s.kind != StepKind::recv_reduce || !overlap) continue;
    ++c.steps;
    c.largest = std::max<std::size_t>(c.largest, s.dst.count * 4);
  }
  return c;
}

TEST(EngineStaging, OutOfPlaceRingAndTreeReserveNone) {
  // Out of place they land every message in the output, which does not overlap what it
  // is reduced with. (RHD reduces within its output buffer even then, and stages.)
  const std::uint64_t n = 1 << 20;  // 4 MiB of f32: pipelined in slices
  std::vector<std::byte> in(n * 4), out(n * 4);
  for (const Algorithm a : {Algorithm::ring, Algorithm::tree})
    for (int rank = 0; rank < kWorld; ++rank) {
      const auto plan = build_plan(request(Collective::allreduce, a, rank, n));
      EXPECT_EQ(count_staged(*plan, in.data(), out.data()).steps, 0u);
      const auto need = staging_need(*plan, 4, in.data(), out.data());
      EXPECT_EQ(need.slots, 0u) << braid::to_string(a) << " rank " << rank;
    }
}

TEST(EngineStaging, InPlaceReservationIsOnePerStagedStepUpToTheCapOfTheLargestMessage) {
  bool capped = false;
  // Small slices (BRAID_CHUNK_BYTES) make many staged steps of one call.
  for (const std::size_t slice : {std::size_t{512} << 10, std::size_t{16} << 10}) {
    for (const std::uint64_t n : {std::uint64_t{1000}, std::uint64_t{1} << 18, std::uint64_t{1} << 20}) {
      std::vector<std::byte> buf(n * 4);
      for (const Algorithm a : {Algorithm::ring, Algorithm::tree, Algorithm::rhd})
        for (int rank = 0; rank < kWorld; ++rank) {
          const auto plan = build_plan(request(Collective::allreduce, a, rank, n, slice));
          const auto need = staging_need(*plan, 4, buf.data(), buf.data());  // in place: input is output
          const Counted c = count_staged(*plan, buf.data(), buf.data());
          SCOPED_TRACE(std::string(braid::to_string(a)) + " rank " + std::to_string(rank) + " count " +
                       std::to_string(n) + " slice " + std::to_string(slice));
          EXPECT_EQ(need.slots, std::min(c.steps, kMaxStaging));
          EXPECT_EQ(need.slot_bytes, (c.largest + 63) / 64 * 64);
          EXPECT_LE(need.slots * need.slot_bytes, kMaxStaging * ((n * 4 + 63) / 64 * 64));
          // The same call reserves the same, however often it comes.
          const auto again = staging_need(*build_plan(request(Collective::allreduce, a, rank, n, slice)), 4,
                                          buf.data(), buf.data());
          EXPECT_EQ(again.slots, need.slots);
          EXPECT_EQ(again.slot_bytes, need.slot_bytes);
          capped |= c.steps > kMaxStaging;
        }
    }
  }
  EXPECT_TRUE(capped) << "no plan here has more staged steps than kMaxStaging: the cap goes untested";
}

TEST(EngineStaging, InPlaceReduceScatterStagesItsOwnBlockOnly) {
  // In place, rank r's output is input[r*n, (r+1)*n): the receives reduced into that block
  // are staged, and no slot is larger than a block.
  const std::uint64_t n = 1 << 16;
  std::vector<std::byte> buf(n * kWorld * 4);
  for (int rank = 0; rank < kWorld; ++rank) {
    const auto plan = build_plan(request(Collective::reduce_scatter, Algorithm::ring, rank, n));
    const auto* out = buf.data() + static_cast<std::size_t>(rank) * n * 4;
    const auto need = staging_need(*plan, 4, buf.data(), out);
    const Counted c = count_staged(*plan, buf.data(), out);
    EXPECT_EQ(need.slots, std::min(c.steps, kMaxStaging)) << "rank " << rank;
    EXPECT_LE(need.slot_bytes, n * 4) << "rank " << rank;
  }
}

}  // namespace
