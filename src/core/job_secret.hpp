// The job's secret and a communicator's id, agreed through the store at creation.
//
// Rank 0 picks the communicator id and, unless every rank was given a token, a random
// one; it publishes them under the store key "meta":
//   "<comm id, hex>\ntoken <token>"   (a token rank 0 made: the store carries it)
//   "<comm id, hex>\ngiven"           (a given token: never written to the store)
// A token is given by BRAID_AUTH_TOKEN (braidrun sets a fresh one) or, for a communicator
// made from a UniqueId (from_mpi, PMIx under mpirun or srun), by the id's nonce, which
// reached every rank privately. A given token stays out of the store. A token rank 0
// makes is as private as the store: under torchrun or a bare MASTER_ADDR without
// BRAID_AUTH_TOKEN the store has no secret and the job is unauthenticated, as torch's own
// TCPStore is (docs/reliability.md, "Threat model").
#pragma once

#include <braid/store.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace braid::core {

struct JobSecret {
  std::uint64_t comm_id = 0;
  std::string token;
};

/// The "meta" record as read from the store (untrusted): the communicator id, and the
/// token rank 0 made ("" when rank 0 was given one: `given`). nullopt when malformed.
struct MetaRecord {
  std::uint64_t comm_id = 0;
  bool given = false;
  std::string token;
};
std::optional<MetaRecord> parse_meta(const std::string& meta);

/// Rank 0 publishes, every other rank reads (waiting up to `timeout`). `token` is this
/// rank's BRAID_AUTH_TOKEN ("" when not given). Throws InvalidUsage when rank 0 and this
/// rank disagree on whether a token was given, Network when the record is malformed
/// (another program's store, or a corrupt one), Timeout from the store.
JobSecret share_secret(Store& store, int rank, const std::string& token, std::chrono::milliseconds timeout);

}  // namespace braid::core
