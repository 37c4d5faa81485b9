// braid configuration: the one table of every environment variable braid reads.
//
// Each row (base::Setting) has a name, a type, a default and a help line; each
// transport declares its own rows in its folder (transport/registry.hpp). The table is
// parsed once per process into an immutable Config (Config::global()); explicit options
// (CommOptions, per-call options) override it. This file's .cpp is the only place
// in braid that calls getenv. `braid_info --config` and docs/configuration.md are
// generated from the same table.
#pragma once

#include "base/logging.hpp"
#include "base/settings.hpp"
#include "base/tls.hpp"
#include "gpu/runtime.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace braid::core {

/// Log verbosity (BRAID_DEBUG); logging itself lives in base.
using LogLevel = base::LogLevel;

/// The first host of a Slurm host list ("node[07-09,12],gpu1" -> "node07"); empty when
/// the list is malformed.
std::string first_slurm_host(const std::string& list);

/// Parsed configuration. Plain data; copy freely. Every default comes from the table row
/// (config.cpp, or the transport's entry for its rows); the initializers below are only
/// what an unparsed Config holds.
struct Config {
  /// Every row's typed value, including the transports' rows (read by their entries).
  base::Settings settings;
  // --- behaviour ---
  LogLevel log_level = LogLevel::warn;
  std::chrono::milliseconds timeout{};
  std::string algo;
  bool tune_measure = false;  ///< BRAID_TUNE=measure (false: model)
  std::string codec;
  double codec_max_error = 0;  ///< BRAID_CODEC_MAX_ERROR
  bool link_probe = true;      ///< BRAID_LINK_PROBE: codec auto measures the link between hosts
  std::string transport;       ///< "auto" or a registered transport's name
  std::size_t chunk_bytes = 0;
  std::size_t device_chunk_bytes = 0;  ///< BRAID_DEVICE_CHUNK_BYTES: the slice of device-path calls
  std::size_t device_pinned_bytes = 0;  ///< BRAID_DEVICE_PINNED_BYTES: pinned memory of calls in flight (0: no limit)
  int spin_us = -1;  ///< -1 = automatic (see BRAID_SPIN_US)
  bool wait_helps = false;  ///< BRAID_WAIT_HELPS
  std::size_t inline_bytes = 0;  ///< BRAID_INLINE_BYTES
  std::size_t plan_cache = 0;
  bool check_args = false;
  std::size_t trace_entries = 0;  ///< BRAID_TRACE_ENTRIES (flight recorder)
  std::string trace_dir;          ///< BRAID_TRACE_DIR
  int metrics_port = 0;           ///< BRAID_METRICS_PORT (0: no endpoint)
  int report_seconds = 0;         ///< BRAID_REPORT_SECONDS (0: no report)
  bool deterministic = false;
  std::string cost_model;  ///< file with a serialized cost model (BRAID_COST_MODEL)
  std::string ucx_library;  ///< BRAID_UCX_LIBRARY: what the UCX loader opens
  std::string ibverbs_library;  ///< BRAID_IBVERBS_LIBRARY: what the libibverbs loader opens
  std::string pmix_library;  ///< BRAID_PMIX_LIBRARY: what the PMIx loader opens
  std::string gpu_backend;  ///< BRAID_GPU_BACKEND: auto, cuda, emulated or none
  gpu::RuntimeOptions gpu_options;  ///< BRAID_EMU_HW_QUEUES, BRAID_EMU_HOSTFN_US, CUDA_DEVICE_MAX_CONNECTIONS
  /// BRAID_DEVICE_PATH: how collectives on device buffers run (docs/gpu.md). stream: the
  /// whole program enqueued at call time on the communicator's stream (core::DeviceFlow);
  /// staged: through pinned copies of the whole buffers and the host path. (The direct
  /// path, the engine driving the plan on the device step by step, is gone: docs/gpu.md.)
  enum class DevicePath : std::uint8_t { stream, staged };
  DevicePath device_path = DevicePath::stream;
  std::string nvml_library;  ///< BRAID_NVML_LIBRARY
  // --- identity and security ---
  std::string auth_token;
  /// BRAID_TLS: TLS on the TCP transport's and the store's connections, with these files.
  bool tls = false;
  base::tls::Files tls_files;
  std::string host_id;
  // --- launch (BRAID_* first, then torchrun, Open MPI, Slurm) ---
  std::optional<int> rank, world_size, local_rank, local_size;
  std::string master_addr;
  std::optional<int> master_port;
  bool store_external = false;     ///< braidrun serves the store; rank 0 must not
  bool torch_agent_store = false;  ///< TORCHELASTIC_USE_AGENT_STORE=True (torchrun's agent serves a torch store)
  std::string pmix_namespace;  ///< PMIX_NAMESPACE: set when a PMIx server launched this process
  std::string launcher;  ///< which family of variables supplied rank/size ("braid", "torchrun", ...)

  /// The process-wide configuration, parsed from the environment on first use.
  static const Config& global();
  /// Parses from an arbitrary lookup (tests). Throws braid::Error(InvalidUsage)
  /// naming the variable and the accepted form when a value does not parse.
  static Config parse(const std::function<std::optional<std::string>(const char*)>& lookup);
};

/// Every variable braid reads, in documentation order: the core's rows with each
/// registered transport's rows in the middle.
const std::vector<base::Setting>& config_table();

/// The value of `name` in this process's environment, if set (the only getenv).
std::optional<std::string> env_value(const char* name);

/// The TLS credentials of `cfg` (BRAID_TLS_CERT, _KEY, _CA), loaded once per process and
/// shared; null when BRAID_TLS is off. Throws InvalidUsage when a file is missing or
/// does not fit (base/tls.hpp).
std::shared_ptr<const base::tls::Context> tls_context(const Config& cfg);

/// The process's device runtime, started on first use with BRAID_GPU_BACKEND.
gpu::Runtime& gpu_runtime();

using base::parse_bytes;
using base::parse_duration;

}  // namespace braid::core
