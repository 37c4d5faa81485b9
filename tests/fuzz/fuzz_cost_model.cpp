// The cost-model file (BRAID_COST_MODEL, read by core's MeasuredTuner): its text through
// collectives::deserialize, and a parsed model through the tuner that prices plans with
// it, since a file's extreme constants (0, denormals, 1e308) flow into the simulation.
#include "fuzz_common.hpp"

#include "collectives/cost.hpp"
#include "collectives/tuner.hpp"

#include <braid/error.hpp>

namespace c = braid::collectives;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  c::CostModel m;
  try {
    m = c::deserialize(text);
  } catch (const braid::Error&) {
    return 0;  // refused with a message: what a malformed file must get
  }
  // What was parsed is written and read back exactly (hex floats).
  const c::CostModel again = c::deserialize(c::serialize(m));
  for (int k = 0; k < c::kNumLinkClasses; ++k) {
    const auto& a = m.link[static_cast<std::size_t>(k)];
    const auto& b = again.link[static_cast<std::size_t>(k)];
    FUZZ_CHECK(a.alpha == b.alpha && a.beta == b.beta && a.eager == b.eager);
  }
  FUZZ_CHECK(m.gamma == again.gamma && m.copy_beta == again.copy_beta);
  // Price one call with it, as the communicator's tuner would (4 ranks on 2 hosts).
  c::Tuner tuner(4, c::Topology::hosts(4, 2, c::LinkClass::shm, c::LinkClass::tcp), m);
  const std::uint64_t count = size % 4096;
  try {
    const auto choice = tuner.choose(c::Collective::allreduce, count, 4, braid::ReduceOp::sum);
    FUZZ_CHECK(choice != nullptr);
  } catch (const braid::Error&) {
  }
  return 0;
}
