// braid configuration: the one table of every environment variable braid reads.
//
// Each entry has a name, a type, a default and a help line. The table is parsed
// once per process into an immutable Config (Config::global()); explicit options
// (CommOptions, per-call options) override it. This file's .cpp is the only place
// in braid that calls getenv. `braid_info --config` and docs/configuration.md are
// generated from the same table.
#pragma once

#include "base/logging.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace braid::core {

/// Log verbosity (BRAID_DEBUG); logging itself lives in base.
using LogLevel = base::LogLevel;

/// The first host of a Slurm host list ("node[07-09,12],gpu1" -> "node07"); empty when
/// the list is malformed.
std::string first_slurm_host(const std::string& list);

/// Parsed configuration. Plain data; copy freely.
struct Config {
  // --- behaviour ---
  LogLevel log_level = LogLevel::warn;
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  std::string algo = "auto";
  bool tune_measure = true;  ///< BRAID_TUNE=measure (false: model)
  std::string codec = "none";
  double codec_max_error = 0.004;  ///< BRAID_CODEC_MAX_ERROR
  std::string transport = "auto";
  std::size_t chunk_bytes = 512 * 1024;
  int spin_us = -1;  ///< -1 = automatic (see BRAID_SPIN_US)
  bool wait_helps = false;  ///< BRAID_WAIT_HELPS
  std::size_t inline_bytes = 64 * 1024;  ///< BRAID_INLINE_BYTES
  std::size_t plan_cache = 64;
  bool check_args = false;
  bool deterministic = false;
  std::string cost_model;  ///< file with a serialized cost model (BRAID_COST_MODEL)
  // --- network ---
  std::string socket_ifname;
  int sockets_per_peer = 2;
  std::size_t socket_buffer = 0;
  std::string auth_token;
  std::string host_id;
  std::size_t shm_slot_bytes = 512 * 1024;
  int shm_slots = 8;
  // --- launch (BRAID_* first, then torchrun, Open MPI, Slurm) ---
  std::optional<int> rank, world_size, local_rank, local_size;
  std::string master_addr;
  std::optional<int> master_port;
  bool store_external = false;     ///< braidrun serves the store; rank 0 must not
  bool torch_agent_store = false;  ///< TORCHELASTIC_USE_AGENT_STORE=True (torchrun's agent serves a torch store)
  std::string launcher;  ///< which family of variables supplied rank/size ("braid", "torchrun", ...)

  /// The process-wide configuration, parsed from the environment on first use.
  static const Config& global();
  /// Parses from an arbitrary lookup (tests). Throws braid::Error(InvalidUsage)
  /// naming the variable and the accepted form when a value does not parse.
  static Config parse(const std::function<std::optional<std::string>(const char*)>& lookup);
};

/// One row of the table, for reports and docs.
struct ConfigVar {
  const char* name;
  const char* type;
  const char* default_value;
  const char* help;
  bool braid_owned;  ///< false for launcher variables (RANK, SLURM_PROCID, ...)
};

/// Every variable braid reads, in documentation order.
const std::vector<ConfigVar>& config_table();

/// The value of `name` in this process's environment, if set (the only getenv).
std::optional<std::string> env_value(const char* name);

/// Parses "512K", "4M", "1G", "1048576" (binary multiples). Empty on bad input.
std::optional<std::size_t> parse_bytes(const std::string& s);

/// Parses "30s", "500ms", "2m", "1h", or a plain number of seconds. Empty on bad input.
std::optional<std::chrono::milliseconds> parse_duration(const std::string& s);

}  // namespace braid::core
