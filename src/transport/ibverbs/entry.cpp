// The verbs transport's registry entry. Auto mode never picks it: it has run against the
// test provider only (hardware-untested, docs/transport-ibverbs.md), so a pair uses it when
// forced (BRAID_TRANSPORT=ibverbs or CommOptions::transport = "ibverbs"); UCX remains the
// automatic RDMA path between hosts.
#include "transport/ibverbs/ibv_transport.hpp"
#include "transport/registry.hpp"

namespace braid::transport {

namespace {

int preference(const PairFacts&) { return 0; }

std::unique_ptr<Transport> make(const TransportContext& c) {
  auto o = options_for<IbvOptions>(c);
  const base::Settings& s = *c.settings;
  // BRAID_IBVERBS_LIBRARY is core's row (discovery loads libibverbs too); a transport test's
  // own settings may not carry it.
  o.library = s.raw("BRAID_IBVERBS_LIBRARY");
  o.gpu_pci_bus_id = c.gpu_pci_bus_id;
  o.hca = s.text("BRAID_IB_HCA");
  o.gid_index = static_cast<int>(s.integer("BRAID_IB_GID_INDEX").value_or(-1));
  const std::string& family = s.text("BRAID_IB_ADDR_FAMILY");  // a choice row: lowercase
  o.addr_family = family == "af_inet" ? "AF_INET" : family == "af_inet6" ? "AF_INET6" : "";
  o.addr_range = s.text("BRAID_IB_ADDR_RANGE");
  o.roce_version = static_cast<int>(s.integer("BRAID_IB_ROCE_VERSION_NUM").value_or(2));
  o.traffic_class = static_cast<int>(s.integer("BRAID_IB_TC").value_or(0));
  o.service_level = static_cast<int>(s.integer("BRAID_IB_SL").value_or(0));
  o.timeout = static_cast<int>(s.integer("BRAID_IB_TIMEOUT").value_or(18));
  o.retry_cnt = static_cast<int>(s.integer("BRAID_IB_RETRY_CNT").value_or(7));
  o.slots = static_cast<std::size_t>(s.integer("BRAID_IB_SLOTS").value_or(16));
  o.qps_per_peer = static_cast<std::size_t>(s.integer("BRAID_IB_QPS_PER_PEER").value_or(1));
  o.slot_bytes = s.bytes("BRAID_IB_SLOT_BYTES");
  o.rndv_threshold = s.bytes("BRAID_IB_RNDV_THRESHOLD");
  o.reg_cache = s.boolean("BRAID_IB_REG_CACHE");
  const std::string& gdr = s.text("BRAID_GDR");  // a choice row: auto, 0 or 1
  o.gdr = gdr == "1" ? 1 : gdr == "0" ? 0 : -1;
  o.gpu = c.gpu;
  o.gpu_device = c.gpu_device;
  return make_ibverbs_transport(o, *c.poller, *c.directory);
}

}  // namespace

const TransportEntry& ibverbs_entry() {
  using base::SettingType;
  static const TransportEntry entry{
      "ibverbs",
      "InfiniBand/RoCE verbs, RC queue pairs (hardware-untested; only when forced)",
      "ib",
      {
          {"BRAID_IB_HCA", SettingType::text, "",
           "RDMA devices and ports the ibverbs transport may use, NCCL's syntax: mlx5_0:1,mlx5_1 (prefixes), "
           "=mlx5_0 (exact names), ^mlx5_2 (all but). Default: the first ACTIVE port."},
          {"BRAID_IB_GID_INDEX", SettingType::integer, "auto",
           "GID index the ibverbs transport uses on RoCE (default: chosen as NCCL does: no link-local, the "
           "address family and range below, RoCE v2 preferred).",
           true, 0, 255, "auto"},
          {"BRAID_IB_ADDR_FAMILY", SettingType::choice, "any", "Address family of the RoCE GID: any, AF_INET or AF_INET6.",
           true, 0, 0, "any|af_inet|af_inet6"},
          {"BRAID_IB_ADDR_RANGE", SettingType::text, "",
           "Only RoCE GIDs in this subnet (10.0.0.0/8, fd00::/8); default any."},
          {"BRAID_IB_ROCE_VERSION_NUM", SettingType::integer, "2", "Preferred RoCE version (1 or 2).", true, 1, 2},
          {"BRAID_IB_TC", SettingType::integer, "0", "Traffic class of RoCE packets (GRH).", true, 0, 255},
          {"BRAID_IB_SL", SettingType::integer, "0", "InfiniBand service level.", true, 0, 15},
          {"BRAID_IB_TIMEOUT", SettingType::integer, "18",
           "Local ACK timeout exponent: 4.096 us * 2^value per retry (18: about 1 s).", true, 1, 31},
          {"BRAID_IB_RETRY_CNT", SettingType::integer, "7",
           "Transport retries before a peer is declared unreachable.", true, 0, 7},
          {"BRAID_IB_QPS_PER_PEER", SettingType::integer, "1",
           "Reliable-connected queue pairs per peer (1 to 16, the same on every rank): rendezvous messages of at "
           "least 128 KiB are striped over them (NCCL_IB_QPS_PER_CONNECTION); more spread a link's traffic over "
           "more NIC engines and fabric paths (ECMP on RoCE).",
           true, 1, 16},
          {"BRAID_IB_SLOTS", SettingType::integer, "16",
           "Receive slots per peer (a power of two, 4 to 4096): how many eager chunks may be in flight.", true, 4,
           4096},
          {"BRAID_IB_SLOT_BYTES", SettingType::bytes, "64K",
           "Bytes per receive slot (a power of two, 256 to 16M, the same on every rank); a slot holds a 32-byte "
           "header and a chunk of an eager message.",
           true, 256},
          {"BRAID_IB_RNDV_THRESHOLD", SettingType::bytes, "256K",
           "Messages of at least this size are written straight into the receiver's buffer (rendezvous: "
           "registration of both buffers, one RDMA write) instead of being copied through the slots."},
          {"BRAID_IB_REG_CACHE", SettingType::boolean, "0",
           "Keep registrations of user buffers for reuse (faster rendezvous). Unsafe when the program frees "
           "memory and gets the same addresses back for other pages before braid is done with them."},
          {"BRAID_GDR", SettingType::choice, "auto",
           "GPUDirect RDMA for the ibverbs transport: the NIC reads and writes GPU buffers itself (registered "
           "through dma-buf, else nvidia-peermem). auto: where available; 0: device buffers are staged through "
           "pinned host memory; 1: required (a communicator with a GPU fails to start without it).",
           true, 0, 0, "auto|0|1"},
      },
      &preference,
      &make,
      false,  // never in auto mode: hardware-untested
  };
  return entry;
}

}  // namespace braid::transport
