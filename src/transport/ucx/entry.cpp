// The UCX transport's registry entry. Auto mode picks it for pairs on different hosts
// when both ranks' UCX reports an RDMA transport (rc, dc or ud over InfiniBand or RoCE;
// PairFacts::rdma), over tcp; otherwise it serves a pair only when forced
// (BRAID_TRANSPORT=ucx or CommOptions::transport = "ucx"). docs/transport-ucx.md.
#include "transport/registry.hpp"
#include "transport/ucx/ucx_transport.hpp"

namespace braid::transport {

namespace {

/// Above tcp (10) between hosts with an RDMA fabric at both ends; below shm (20) never
/// matters (shm serves only one host).
int preference(const PairFacts& p) { return !p.same_host && p.rdma ? 15 : 0; }

std::unique_ptr<Transport> make(const TransportContext& c) {
  auto u = options_for<UcxOptions>(c);
  u.emulated_device_memory = c.emulated_device_memory;
  // BRAID_UCX_LIBRARY is core's row (braid_info loads UCX too); the engine's settings carry
  // it, a transport test's own settings do not (then the default library).
  u.library = c.settings->raw("BRAID_UCX_LIBRARY");
  u.eager_limit = c.settings->bytes("BRAID_UCX_EAGER_LIMIT");
  u.zcopy = c.settings->text("BRAID_UCX_ZCOPY");  // a choice row: auto, 0 or 1
  // BRAID_SOCKET_IFNAME is tcp's row: read raw, since a transport test's own settings may
  // not carry it.
  u.ifname = c.settings->raw("BRAID_SOCKET_IFNAME");
  u.master_addr = c.master_addr;
  u.net_devices_given = c.settings->given("UCX_NET_DEVICES");
  return make_ucx_transport(u, *c.poller, *c.directory);
}

}  // namespace

const TransportEntry& ucx_entry() {
  using base::SettingType;
  static const TransportEntry entry{
      "ucx",
      "UCX (UCP tag API): between hosts with an RDMA fabric (InfiniBand/RoCE, as UCX reports it), else when forced",
      "tcp",
      {
          {"BRAID_UCX_EAGER_LIMIT", SettingType::bytes, "64K",
           "Largest message the ucx transport sends eagerly, completing without the peer's receive (sets "
           "UCX's RNDV_THRESH; 0: UCX_RNDV_THRESH or UCX's choice). The process's first ucx communicator "
           "decides."},
          {"BRAID_UCX_ZCOPY", SettingType::choice, "auto",
           "Zero-copy sends in the ucx transport. auto: off where UCX has no RDMA transport (UCX 1.13's tcp "
           "transport aborts the process when a link is cut under zero-copy sends; docs/transport-ucx.md), "
           "UCX's choice otherwise; 0: off (over RDMA, for eager messages only); 1: UCX's choice "
           "(UCX_ZCOPY_THRESH, which auto and 0 override where they turn zero-copy off). The process's first ucx "
           "communicator decides.",
           true, 0, 0, "auto|0|1"},
          {"UCX_NET_DEVICES", SettingType::text, "",
           "UCX's own: the network devices UCX may use. Unset, braid gives UCX's tcp transport only the "
           "interface braid chose (BRAID_SOCKET_IFNAME, else the one on the route to the store) and keeps "
           "every RDMA device; set, UCX's choice stands.",
           false},
      },
      &preference,
      &make,
  };
  return entry;
}

}  // namespace braid::transport
