// The job's secret and a communicator's id, agreed through the store at creation.
//
// Rank 0 picks the communicator id and, unless every rank was given BRAID_AUTH_TOKEN, a
// random token; it publishes them under the store key "meta":
//   "<comm id, hex>\ntoken <token>"   (a token rank 0 made: the store carries it)
//   "<comm id, hex>\ngiven"           (BRAID_AUTH_TOKEN: never written to the store)
// A given token stays out of the store, so whoever can read the store (it has no
// authentication of its own) does not learn it (docs/reliability.md, "Threat model").
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
