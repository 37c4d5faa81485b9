// The UCX transport's registry entry: used only when forced (BRAID_TRANSPORT=ucx or
// CommOptions::transport = "ucx") until the auto rule (RDMA between hosts) exists.
#include "transport/registry.hpp"
#include "transport/ucx/ucx_transport.hpp"

namespace braid::transport {

namespace {

std::unique_ptr<Transport> make(const TransportContext& c) {
  auto u = options_for<UcxOptions>(c);
  // BRAID_UCX_LIBRARY is core's row (braid_info loads UCX too); the engine's settings carry
  // it, a transport test's own settings do not (then the default library).
  u.library = c.settings->raw("BRAID_UCX_LIBRARY");
  u.eager_limit = c.settings->bytes("BRAID_UCX_EAGER_LIMIT");
  return make_ucx_transport(u, *c.poller, *c.directory);
}

}  // namespace

const TransportEntry& ucx_entry() {
  using base::SettingType;
  static const TransportEntry entry{
      "ucx",
      "UCX (UCP tag API): forced only, host memory",
      "tcp",
      {
          {"BRAID_UCX_EAGER_LIMIT", SettingType::bytes, "64K",
           "Largest message the ucx transport sends eagerly, completing without the peer's receive (sets "
           "UCX's RNDV_THRESH; 0: UCX_RNDV_THRESH or UCX's choice). The process's first ucx communicator "
           "decides."},
      },
      [](const PairFacts&) { return 0; },  // forced only, until the auto rule exists
      &make,
  };
  return entry;
}

}  // namespace braid::transport
