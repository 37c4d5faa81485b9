// The text inside a UniqueId's 128 bytes: "braid-uid-1 ADDR PORT NONCE", NUL-padded.
// The bytes come from another process (MPI_Bcast, a file, a command line), so they are
// parsed as untrusted input. Private to core, its tests and the fuzz targets.
#pragma once

#include <braid/communicator.hpp>

#include <optional>
#include <string>

namespace braid::core {

/// What a UniqueId names: the store server's address and port, and the nonce that keeps
/// communicators made from different ids apart in that store.
struct UniqueIdFields {
  std::string addr;
  int port = 0;
  std::string nonce;
};

/// The fields of `id`, or nothing when its bytes are not a braid UniqueId (another magic,
/// a port outside 1..65535, no nonce).
std::optional<UniqueIdFields> parse_unique_id(const UniqueId& id);

}  // namespace braid::core
