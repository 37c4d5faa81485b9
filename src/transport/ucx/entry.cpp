// The UCX transport's registry entry: used only when forced (BRAID_TRANSPORT=ucx or
// CommOptions::transport = "ucx") until the auto rule (RDMA between hosts) exists.
#include "transport/registry.hpp"
#include "transport/ucx/ucx_transport.hpp"

namespace braid::transport {

namespace {

std::unique_ptr<Transport> make(const TransportContext& c) {
  UcxOptions u;
  static_cast<CommonOptions&>(u) = c.common;
  // BRAID_UCX_LIBRARY is core's row (braid_info loads UCX too); the engine's settings carry
  // it, a transport test's own settings do not (then the default library).
  u.library = c.settings->raw("BRAID_UCX_LIBRARY");
  return make_ucx_transport(u, *c.poller, *c.directory);
}

int preference(const PairFacts&) { return 0; }

}  // namespace

const TransportEntry& ucx_entry() {
  static const TransportEntry entry{
      "ucx", "UCX (UCP tag API): forced only, host memory", "tcp", {}, &preference, &make,
  };
  return entry;
}

}  // namespace braid::transport
