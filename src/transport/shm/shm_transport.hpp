// braid shared-memory transport: ranks of one host exchange messages through
// per-pair single-producer/single-consumer rings in a shared segment, with a Unix
// socket per pair for set-up, wake-ups and liveness. See shm_transport.cpp for the
// protocol and docs/transport-shm.md for the prose.
#pragma once

#include "transport/transport.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace braid::gpu {
class Runtime;
}

namespace braid::transport {

/// Settings of one shared-memory transport instance (one per communicator). Every
/// rank of a communicator must use the same `slots` and `slot_bytes` (checked at
/// connection set-up); the other fields are local choices.
/// comm_id (CommonOptions) also names the communicator's segments and doorbell sockets.
struct ShmOptions : CommonOptions {
  /// Payload bytes of one ring slot; a multiple of 4096 in [4096, 1 GiB]. Messages
  /// are cut into parts of this size.
  std::size_t slot_bytes = std::size_t{512} << 10;
  /// Slots per ring, in [1, 4096]. A pair of ranks shares one segment holding two
  /// rings, i.e. about 2 * slots * slot_bytes of /dev/shm (8 MiB by default).
  int slots = 8;
  /// Directory in which segments are created (a tmpfs). Tests point it elsewhere.
  std::string segment_dir = "/dev/shm";
  /// The communicator's device runtime and GPU (null and -1 without one). With one, the
  /// connections take device buffers (send_device/recv_device: the engine's direct device
  /// path); where both ranks of a pair have one (and device_ring), device messages move
  /// GPU to GPU through a device ring that the lower rank allocates and the other maps
  /// (CUDA IPC; NVLink or PCIe peer to peer), else through the host ring.
  gpu::Runtime* gpu = nullptr;
  int gpu_device = -1;
  bool device_ring = true;  ///< BRAID_SHM_DEVICE_RING
};

/// Creates the transport: binds this rank's doorbell socket (abstract Unix
/// namespace, named after comm_id, rank and pid), registers it with `poller`, and
/// publishes its name under key "shm" in `directory`. Connections are made lazily;
/// the lower rank of a pair creates the pair's segment. Throws braid::Error
/// (InvalidUsage for bad options, System when the socket cannot be bound).
/// `poller` and `directory` must outlive the transport.
std::unique_ptr<Transport> make_shm_transport(const ShmOptions& options, Poller& poller,
                                              PeerDirectory& directory);

/// Parts of this process's shm connections now waiting behind copies on their copy
/// streams (the asynchronous copy-engine proxy): to be published or released once their
/// copy has run (tests).
long shm_parts_behind_copies() noexcept;

/// Bytes of /dev/shm one pair of ranks needs with these settings (the segment size).
std::size_t shm_segment_bytes(std::size_t slot_bytes, int slots);

/// File name (without directory) of the segment of ranks a < b of a communicator:
/// "braid-<comm_id as 16 hex digits>-<a>-<b>". It exists only while the lower rank
/// sets the segment up.
std::string shm_segment_name(std::uint64_t comm_id, int a, int b);

}  // namespace braid::transport
