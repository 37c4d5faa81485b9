// The shared-memory transport's registry entry: its configuration rows and how the engine
// makes it.
#include "base/text.hpp"
#include "transport/registry.hpp"
#include "transport/shm/shm_transport.hpp"

namespace braid::transport {

namespace {

std::unique_ptr<Transport> make(const TransportContext& c) {
  auto so = options_for<ShmOptions>(c);
  so.slot_bytes = c.settings->bytes("BRAID_SHM_SLOT_BYTES");
  so.slots = static_cast<int>(c.settings->integer("BRAID_SHM_SLOTS").value_or(8));
  // GPU buffers reach a connection only on the direct device path (the staged one hands
  // every transport pinned host memory): elsewhere no ring is made, so that a host-only
  // communicator on a GPU host allocates no GPU memory and opens no IPC handle.
  // (Core's row: a transport test's own settings may not carry it, hence raw.)
  if (base::lower(c.settings->raw("BRAID_DEVICE_PATH")) == "direct") {
    so.gpu = c.gpu;
    so.gpu_device = c.gpu_device;
  }
  so.device_ring = c.settings->boolean("BRAID_SHM_DEVICE_RING");
  return make_shm_transport(so, *c.poller, *c.directory);
}

// Ranks of one host, ahead of tcp. Across host identities only when forced
// (BRAID_TRANSPORT=shm), which works where the "hosts" are emulated on one machine.
int preference(const PairFacts& p) { return p.same_host ? 20 : 0; }

}  // namespace

const TransportEntry& shm_entry() {
  using base::SettingType;
  static const TransportEntry entry{
      "shm",
      "shared-memory rings between ranks of one host",
      "shm",
      {
          {"BRAID_SHM_SLOT_BYTES", SettingType::bytes, "512K",
           "Shared memory: bytes per ring slot (a multiple of 4K); messages move in parts of this size.", true,
           4096, 0, "", 4096},
          {"BRAID_SHM_SLOTS", SettingType::integer, "8",
           "Shared memory: slots per ring; each pair of ranks uses about 2 x slots x slot bytes of /dev/shm.", true,
           1, 4096},
          {"BRAID_SHM_DEVICE_RING", SettingType::boolean, "1",
           "Shared memory between ranks with GPUs: device buffers move GPU to GPU through a device ring (CUDA IPC: "
           "NVLink or PCIe peer to peer; 2 x slots x slot bytes of the lower rank's GPU memory per pair). 0: "
           "through the host ring."},
      },
      &preference,
      &make,
  };
  return entry;
}

}  // namespace braid::transport
