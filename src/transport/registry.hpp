// The transport registry: every transport braid was built with, each described by one
// entry (its name, its configuration rows, which pairs it can serve, and a factory).
//
// The engine knows no transport by name: core's Router picks an entry per pair from the
// communicator's topology and BRAID_TRANSPORT, and the engine instantiates entries through
// their factories. Adding a transport is a folder under src/transport with its code and an
// entry (see tcp/entry.cpp), plus one line in registry.cpp (docs/architecture.md).
#pragma once

#include "base/settings.hpp"
#include "transport/transport.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace braid::gpu {
class Runtime;
}

namespace braid::transport {

/// What the router knows about a pair of ranks when it picks a transport. Later issues add
/// the memory kinds of the buffers and the devices of both ranks.
struct PairFacts {
  int rank = 0;
  int peer = 0;
  bool same_host = false;  ///< same host identity (hostname + boot id, or BRAID_HOST_ID)
  /// Both ranks have an RDMA fabric (InfiniBand or RoCE, as each one's UCX reports it:
  /// an rc, dc or ud transport); false on one host.
  bool rdma = false;
};

/// The communicator-wide facts a factory gets.
struct TransportContext {
  /// Rank, size, the per-job token, the communicator id, the set-up bound (the
  /// communicator's timeout) and where refused strangers are reported; a factory copies
  /// them into its transport's options.
  CommonOptions common;
  /// Address of the bootstrap store; a hint for picking the interface that reaches peers.
  std::string master_addr;
  /// The PCI bus id of the rank's GPU ("0000:3b:00.0"), "" for none: an RDMA transport
  /// prefers the NIC nearest it.
  std::string gpu_pci_bus_id;
  /// The parsed configuration; an entry reads its own rows from it.
  const base::Settings* settings = nullptr;
  Poller* poller = nullptr;
  PeerDirectory* directory = nullptr;
  /// The process's device memory is host memory (the emulated GPU runtime, tests only): a
  /// transport that moves device memory where its library supports it (ucx) then takes
  /// it as host memory, so that CI runs the engine's no-slot device path.
  bool emulated_device_memory = false;
  /// The communicator's device runtime and GPU (null and -1 without one): a transport that
  /// registers device memory with its NIC itself (ibverbs, GPUDirect RDMA) goes through it.
  gpu::Runtime* gpu = nullptr;
  int gpu_device = -1;
};

struct TransportEntry {
  const char* name;     ///< "tcp": BRAID_TRANSPORT's value, logs, describe_topology()
  const char* summary;  ///< one line for braid_info and the BRAID_TRANSPORT help
  /// The cost model's link class of the pairs it serves ("shm", "tcp", "nvlink", "ib", "pcie").
  const char* link_class;
  /// Its configuration rows (each variable declared once, here).
  std::vector<base::Setting> settings;
  /// How much it wants `pair`: < 0 it cannot serve it; 0 it serves it only when forced
  /// (BRAID_TRANSPORT=<name>); in auto mode the highest positive preference wins.
  int (*preference)(const PairFacts& pair);
  /// Creates the instance of one communicator. Throws braid::Error when it cannot;
  /// Error(Unsupported) when what it needs is absent here (its library, a device), which
  /// auto mode survives by going without it.
  std::unique_ptr<Transport> (*make)(const TransportContext& context);
  /// False for a transport auto mode never picks (its preference is 0 for every pair): a
  /// communicator then does not make it at all, so it opens no device and loads nothing.
  bool in_auto_mode = true;
};

/// A transport's options (TcpOptions, ShmOptions...) with the communicator-wide part filled
/// from `c`; its factory adds its own rows.
template <class Options>
Options options_for(const TransportContext& c) {
  Options o;
  static_cast<CommonOptions&>(o) = c.common;
  return o;
}

/// Every transport of this build, in registration order.
const std::vector<const TransportEntry*>& registry();
/// The entry named `name`, or null.
const TransportEntry* find_transport(std::string_view name);
/// "tcp, shm": the registered names, for messages.
std::string transport_names();

}  // namespace braid::transport
