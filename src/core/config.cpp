// The configuration table and its one parse. This is the only file in braid that
// reads the environment.
#include "core/config.hpp"

#include "base/check.hpp"
#include "base/text.hpp"
#include "gpu/runtime.hpp"
#include "transport/registry.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>

namespace braid::core {

namespace {

using Lookup = std::function<std::optional<std::string>(const char*)>;
using base::Setting;
using base::SettingType;
constexpr double kMaxRanks = 1 << 24;

// "auto|tcp|shm" and the help line of BRAID_TRANSPORT, from the registry.
std::string transport_choices() {
  std::string out = "auto";
  for (const auto* e : transport::registry()) out += std::string("|") + e->name;
  return out;
}
std::string transport_help() {
  std::string out =
      "Transport for every pair: auto (each pair gets the transport that prefers it most: shared memory "
      "between ranks of one host, tcp between hosts; docs/architecture.md) or one of this build's "
      "transports, used for every pair:";
  for (const auto* e : transport::registry()) out += std::string(" ") + e->name + " (" + e->summary + ");";
  out.back() = '.';
  return out;
}

// The table, in documentation order; docs/configuration.md is generated from it. Rows:
// name, type, default, help, braid-owned, min, max, choices (enum values, or an int's
// keywords meaning "unset"), multiple (bytes).
std::vector<Setting> make_table() {
  std::vector<Setting> t = {
      {"BRAID_DEBUG", SettingType::choice, "WARN", "Log level: ERROR, WARN, INFO or TRACE.", true, 0, 0,
       "ERROR|WARN|WARNING|INFO|TRACE"},
      {"BRAID_TIMEOUT", SettingType::duration, "300s",
       "Deadline of every collective and of connection set-up (e.g. 30s, 500ms, 5m)."},
      {"BRAID_ALGO", SettingType::text, "auto",
       "All-reduce algorithm: auto (the tuner prices every plan with the cost model), ring, tree, rhd or hier."},
      {"BRAID_TUNE", SettingType::choice, "measure",
       "How auto chooses among the algorithms the cost model finds plausible (within 4x of its best): "
       "measure (the first calls of each size try each in turn, then all ranks take the fastest "
       "measured) or model (the model's cheapest, no trials). Must be the same on every rank. "
       "docs/cost-model.md.",
       true, 0, 0, "measure|model"},
      {"BRAID_COST_MODEL", SettingType::text, "",
       "File with the tuner's cost-model constants (α, β per link class, γ), as written by the "
       "calibration; default: constants measured on the development machine (docs/cost-model.md). "
       "Must be the same on every rank."},
      {"BRAID_CODEC", SettingType::text, "none",
       "Compression codec of all-reduces that do not name one: none, fp16, bf16, fp8e4m3, fp8e5m2, "
       "int8, int4, sign1, mxfp8, mxfp4, topk:RATIO or auto, with optional suffixes (docs/codecs.md)."},
      {"BRAID_CODEC_MAX_ERROR", SettingType::real, "0.004",
       "Error budget of codec auto: only codecs whose worst-case error relative to the block's "
       "largest value is at most this are considered (0.004 admits fp16, bf16 and int8).",
       true, 0.0, 1.0},
      {"BRAID_LINK_PROBE", SettingType::boolean, "1",
       "1: codec auto prices the link between hosts by measuring it, once per communicator at its "
       "first automatic all-reduce across hosts (rank 0 and the first rank on another host exchange "
       "18 small and 3 messages of 4 MiB; about 0.1 s at 1 Gbit/s), and every rank uses rank 0's "
       "figures. 0: the cost model's figures (BRAID_COST_MODEL or the built-in constants)."},
      {"BRAID_TRANSPORT", SettingType::choice, "auto", transport_help(), true, 0, 0, transport_choices()},
      {"BRAID_DETERMINISTIC", SettingType::boolean, "0",
       "Reduce in fixed rank order so results are bitwise identical across algorithms and layouts "
       "(costs latency; also per call)."},
      {"BRAID_CHUNK_BYTES", SettingType::bytes, "512K",
       "Pipeline slice: large collectives move in slices of at most this many bytes so that "
       "send, receive and reduce overlap.",
       true, 4096},
      {"BRAID_SPIN_US", SettingType::integer, "auto",
       "Microseconds the progress thread polls without progress before it sleeps in epoll. auto: 100 "
       "when the host has a core per local rank (launcher's local size), else 0, because spinning "
       "ranks steal the cores their peers need.",
       true, 0, 10'000'000, "auto"},
      {"BRAID_WAIT_HELPS", SettingType::boolean, "0",
       "1: a thread waiting for a Work drives the progress engine itself (until its work is done "
       "or nothing moves for a while) instead of sleeping until the engine thread wakes it. Off by "
       "default: with 2 ranks on 2 cores a 4 KiB all-reduce took 4.2-9.5 us with it against 3.1 us "
       "without (docs/performance.md); no difference at 64 MiB or with more ranks than cores."},
      {"BRAID_INLINE_BYTES", SettingType::bytes, "64K",
       "Collectives of at most this many bytes (count x element size) that find the progress engine "
       "idle run on the calling thread (until done, or until nothing has moved for the spin time); "
       "sends and receives of at most this size take one pass there. A thread that waits for such a "
       "call drives it; the engine thread finishes what nobody waits for within 200 us. This saves "
       "the thread hand-offs that dominate small-message latency. 0: always the engine thread."},
      {"BRAID_PLAN_CACHE", SettingType::integer, "64", "Plans kept per communicator (0 disables the cache).", true,
       0, 1'000'000},
      {"BRAID_UCX_LIBRARY", SettingType::text, "libucp.so.0",
       "The UCX library braid loads at run time (a path to libucp.so, e.g. HPC-X's or the PyPI "
       "wheel's copy); braid_info prints what it finds. Ignored by builds without UCX support."},
      {"BRAID_IBVERBS_LIBRARY", SettingType::text, "libibverbs.so.1",
       "The libibverbs braid loads at run time to list the host's RDMA devices (a path to "
       "libibverbs.so.1, e.g. MOFED's); braid_info --topology prints what it finds. Ignored by builds "
       "without the verbs headers."},
      {"BRAID_NVML_LIBRARY", SettingType::text, "libnvidia-ml.so.1",
       "The NVML library braid loads at run time to find which GPUs of the host NVLink joins "
       "(braid_info --topology, describe_topology()); a path to libnvidia-ml.so.1. It comes with the "
       "NVIDIA driver; without it the report says NVLink is unknown."},
      {"BRAID_PMIX_LIBRARY", SettingType::text, "libpmix.so.2",
       "The PMIx client library braid loads at run time to find rank 0's store under mpirun or "
       "srun --mpi=pmix when no store address is set (a path to libpmix.so, e.g. the one Open MPI "
       "or Slurm was built with). Ignored by builds without PMIx support."},
      {"BRAID_GPU_BACKEND", SettingType::choice, "auto",
       "Device runtime for GPU buffers: auto (CUDA when this build has it and a GPU is present, "
       "else none: every buffer is host memory), cuda, none, or emulated (tests only: device memory "
       "emulated in host memory, streams as threads; docs/gpu.md). Read once per process.",
       true, 0, 0, "auto|cuda|emulated|none"},
      {"BRAID_EMU_HW_QUEUES", SettingType::integer, "8",
       "Emulated device runtime only (tests): hardware queues per emulated device, each a FIFO "
       "executor thread that streams are mapped onto round-robin in creation order, as "
       "CUDA_DEVICE_MAX_CONNECTIONS maps streams onto a GPU's queues (8 by default there too). A "
       "stream wait blocks every stream of its queue; 1 models CUDA_DEVICE_MAX_CONNECTIONS=1 (what "
       "Megatron and NeMo set). Read once per process.",
       true, 1, 128},
      {"BRAID_EMU_HOSTFN_US", SettingType::integer, "5",
       "Emulated device runtime only (tests): microseconds the emulated driver's one host-callback "
       "thread waits before each host function (launch_host), the low end of a GPU's host-function "
       "round trip (5-10 us), so that a path that leans on callbacks is slow in CI too. 0: none. "
       "Read once per process.",
       true, 0, 1'000'000},
      {"BRAID_EMU_LAZY_LOADING", SettingType::boolean, "1",
       "Emulated device runtime only (tests): the first launch of each kernel on an emulated device "
       "waits until every stream of the device is idle, as CUDA's lazy loading (CUDA_MODULE_LOADING=LAZY, "
       "the default since CUDA 12.2) loads a kernel at its first launch; communicator creation loads "
       "braid's kernels up front (Runtime::load_kernels). 0: kernels are loaded from the start. Read "
       "once per process.",
       true},
      {"CUDA_DEVICE_MAX_CONNECTIONS", SettingType::integer, "8",
       "CUDA: hardware queues per GPU that the driver maps streams onto (it reads the variable "
       "itself). braid reads it to know whether ranks that are threads of one process on one GPU can "
       "wait for each other on their streams (a stream wait blocks its whole queue).",
       false, 1, 32},
      {"BRAID_DEVICE_PATH", SettingType::choice, "stream",
       "How collectives on device buffers run: stream (the default: at the call, the rank's whole "
       "program is enqueued on the communicator's stream, joined to the caller's by events; copies "
       "into pinned slots, braid's kernels, and waits on words that the progress thread sets when a "
       "message has landed, so no host callback and no host wait on the caller's stream), staged (the "
       "whole input copied to pinned host memory, the host path, the result copied back; the caller's "
       "stream waits for the host). Point-to-point calls are staged. The old direct path (the engine "
       "enqueuing the plan step by step, learning progress through host callbacks) is withdrawn: it "
       "deadlocks where streams share hardware queues or the driver's one callback thread (docs/gpu.md). "
       "Neither path has been measured on a GPU yet.",
       true, 0, 0, "stream|staged"},
      {"BRAID_DEVICE_CHUNK_BYTES", SettingType::bytes, "2M",
       "Pipeline slice of collectives on device buffers (BRAID_DEVICE_PATH=stream): each slice costs "
       "the stream a copy, a flag write or wait and a kernel launch at the call, so device slices are "
       "larger than the host's BRAID_CHUNK_BYTES (docs/gpu.md, \"Part sizes\").",
       true, 4096},
      {"BRAID_DEVICE_PINNED_BYTES", SettingType::bytes, "1G",
       "Page-locked host memory the device path's calls in flight may hold per communicator (each "
       "call's transfers go through a pinned block of its own, reused by later calls once the stream "
       "has passed it). A call that would go past it waits, on the calling thread, for earlier calls "
       "to finish (at most its timeout); one call alone may exceed it. 0: no limit.",
       true, 0},
      {"BRAID_CHECK_ARGS", SettingType::boolean, "0",
       "Debug mode: before each collective, check that every rank called the same collective with "
       "the same count, type and op, and name the rank that differs."},
      {"BRAID_TRACE_ENTRIES", SettingType::integer, "1000",
       "Flight recorder: operations each communicator keeps (the last ones; collectives, sends and "
       "receives), dumped with what is running and queued on a failure, on SIGUSR1 or on "
       "Communicator::dump_trace() (docs/observability.md). 0 turns it off.",
       true, 0, 1'000'000},
      {"BRAID_METRICS_PORT", SettingType::integer, "0",
       "Counters of every communicator of the process (calls, errors, bytes, time histograms per "
       "collective, algorithm and codec) in Prometheus' text format, served over HTTP on "
       "127.0.0.1:PORT+local rank (/metrics). 0: no endpoint; Communicator::metrics() reads them "
       "either way (docs/observability.md).",
       true, 0, 65535},
      {"BRAID_REPORT_SECONDS", SettingType::integer, "0",
       "Every this many seconds, each rank logs at INFO the throughput of its large sends per peer "
       "(beside what the cost model expects) and how long after its own start each peer's first data "
       "came, and writes a flight-recorder dump into BRAID_TRACE_DIR when set, for `braid_trace --live` "
       "to name a late rank or a slow link. 0: never.",
       true, 0, 86400},
      {"BRAID_TRACE_DIR", SettingType::text, "",
       "Flight recorder: directory of its dumps, one JSON file per rank and communicator, written when "
       "a communicator fails or times out and on SIGUSR1 (unless the program handles that signal); "
       "`braid_trace DIR` merges them into a report. Empty: no files (dump_trace() still returns one)."},
  };
  // Each transport's rows, declared in its folder.
  for (const auto* e : transport::registry()) t.insert(t.end(), e->settings.begin(), e->settings.end());
  const std::vector<Setting> tail = {
      {"BRAID_AUTH_TOKEN", SettingType::text, "",
       "Shared secret every connection between ranks and every client of the bootstrap store (TcpStore) "
       "must prove it knows (HMAC-SHA-256 over fresh nonces; the token itself never travels and is never "
       "written to the store). braidrun gives each job a fresh one, a UniqueId (from_mpi, PMIx) carries "
       "one. Unset with a bare BRAID_MASTER_ADDR/MASTER_ADDR: rank 0 makes a random token and publishes "
       "it in the store, which then serves any client, so the job is unauthenticated (said once at INFO)."},
      {"BRAID_TLS", SettingType::boolean, "0",
       "TLS 1.3 (OpenSSL) on every TCP connection braid makes: the tcp transport's sockets and the bootstrap "
       "store's. Mutual: each end presents BRAID_TLS_CERT and checks the other's against BRAID_TLS_CA (no "
       "host name check: the CA is the trust root, as in Gloo). Every rank, the store's host and braidrun "
       "must agree. The token is still proven inside the connection. auto then runs pairs on one host over "
       "shm (its bytes never leave the host) and every other pair over tcp; BRAID_TRANSPORT=ucx or ibverbs "
       "is refused (their bytes would travel in clear). Cost measured in docs/performance.md."},
      {"BRAID_TLS_CERT", SettingType::text, "", "With BRAID_TLS=1: this host's certificate chain (PEM file)."},
      {"BRAID_TLS_KEY", SettingType::text, "", "With BRAID_TLS=1: the private key of BRAID_TLS_CERT (PEM file)."},
      {"BRAID_TLS_CA", SettingType::text, "",
       "With BRAID_TLS=1: the CA certificates (PEM file) that signed every rank's certificate."},
      {"BRAID_HOST_ID", SettingType::text, "", "Overrides the host identity (hostname + boot id), to emulate hosts."},
      {"BRAID_RANK", SettingType::integer, "", "This process's rank (set by braidrun).", true, 0, kMaxRanks - 1},
      {"BRAID_WORLD_SIZE", SettingType::integer, "", "Number of ranks (set by braidrun).", true, 1, kMaxRanks},
      {"BRAID_LOCAL_RANK", SettingType::integer, "", "Rank among the ranks of this host.", true, 0, kMaxRanks - 1},
      {"BRAID_LOCAL_SIZE", SettingType::integer, "", "Number of ranks on this host.", true, 1, kMaxRanks},
      {"BRAID_MASTER_ADDR", SettingType::text, "", "Address of the bootstrap store (rank 0 serves it)."},
      {"BRAID_MASTER_PORT", SettingType::integer, "", "Port of the bootstrap store.", true, 1, 65535},
      {"BRAID_STORE_EXTERNAL", SettingType::boolean, "0",
       "The store at BRAID_MASTER_ADDR:PORT is served by someone else (braidrun); rank 0 does not "
       "start one."},
      {"BRAID_STORE_BIND", SettingType::text, "",
       "Address rank 0's store server listens on. Default: the address of BRAID_MASTER_ADDR (every "
       "local address it resolves to; where a host name resolves to a loopback address here, as "
       "Debian's /etc/hosts makes it, also the address of the interface braid uses), never every "
       "interface. 0.0.0.0 listens on all."},
      {"BRAID_STORE_HELLO_TIMEOUT", SettingType::duration, "10s",
       "A store server closes a connection that has not completed its handshake within this."},
      {"BRAID_STORE_MAX_PENDING", SettingType::integer, "64",
       "Connections a store server keeps in their handshake at once; a newer one beyond is refused "
       "(never an older one evicted).",
       true, 1, 1'000'000},
      {"BRAID_STORE_MAX_KEYS", SettingType::integer, "1000000",
       "Keys a store server holds; a SET or ADD of a new key beyond fails with an error naming this row.",
       true, 1, 1'000'000'000},
      {"BRAID_STORE_MAX_BYTES", SettingType::bytes, "1G",
       "Bytes of keys and values a store server holds; a SET beyond fails with an error naming this row.",
       true, 1024},
      {"BRAID_STORE_MAX_WAITS", SettingType::integer, "65536",
       "Blocked GET/WAIT requests a store server keeps for one client; beyond, it closes that client "
       "(logged at WARN with this row's name).",
       true, 1, 100'000'000},
      {"BRAID_STORE_MAX_QUEUED", SettingType::bytes, "512M",
       "Bytes of replies a store server queues for a client that does not read them; beyond, it closes "
       "that client (logged at WARN with this row's name).",
       true, 65536},
      {"RANK", SettingType::integer, "", "torchrun: rank (used when BRAID_RANK is unset).", false, 0, kMaxRanks - 1},
      {"WORLD_SIZE", SettingType::integer, "", "torchrun: world size.", false, 1, kMaxRanks},
      {"LOCAL_RANK", SettingType::integer, "", "torchrun: local rank.", false, 0, kMaxRanks - 1},
      {"LOCAL_WORLD_SIZE", SettingType::integer, "", "torchrun: local world size.", false, 1, kMaxRanks},
      {"MASTER_ADDR", SettingType::text, "", "torchrun: store address (used when BRAID_MASTER_ADDR is unset).",
       false},
      {"MASTER_PORT", SettingType::integer, "", "torchrun: store port.", false, 1, 65535},
      {"TORCHELASTIC_USE_AGENT_STORE", SettingType::text, "",
       "torchrun: True when its elastic agent serves a torch store at MASTER_ADDR:MASTER_PORT; the Python "
       "package then bootstraps through torch's store.",
       false},
      {"OMPI_COMM_WORLD_RANK", SettingType::integer, "", "Open MPI (mpirun): rank.", false, 0, kMaxRanks - 1},
      {"OMPI_COMM_WORLD_SIZE", SettingType::integer, "", "Open MPI (mpirun): world size.", false, 1, kMaxRanks},
      {"OMPI_COMM_WORLD_LOCAL_RANK", SettingType::integer, "", "Open MPI (mpirun): local rank.", false, 0,
       kMaxRanks - 1},
      {"OMPI_COMM_WORLD_LOCAL_SIZE", SettingType::integer, "", "Open MPI (mpirun): local size.", false, 1,
       kMaxRanks},
      {"PMIX_NAMESPACE", SettingType::text, "",
       "PMIx (set by mpirun, prterun and srun --mpi=pmix for every process they start): when it is "
       "set and no store address is, rank 0 creates a UniqueId and every rank reads it through "
       "PMIx (docs/launching.md).",
       false},
      {"SLURM_PROCID", SettingType::integer, "", "Slurm (srun): rank.", false, 0, kMaxRanks - 1},
      {"SLURM_NTASKS", SettingType::integer, "", "Slurm (srun): world size.", false, 1, kMaxRanks},
      {"SLURM_LOCALID", SettingType::integer, "", "Slurm (srun): local rank.", false, 0, kMaxRanks - 1},
      {"SLURM_STEP_NODELIST", SettingType::text, "",
       "Slurm (srun): the step's nodes; its first node, where rank 0 runs, is the store's host when "
       "BRAID_MASTER_ADDR and MASTER_ADDR are unset (else SLURM_JOB_NODELIST's first node).",
       false},
      {"SLURM_JOB_NODELIST", SettingType::text, "", "Slurm: the job's nodes (used when SLURM_STEP_NODELIST is unset).",
       false},
      {"SLURM_JOB_ID", SettingType::integer, "",
       "Slurm: job id; the store's port is 15000 + (job id mod 10000) when BRAID_MASTER_PORT and "
       "MASTER_PORT are unset.",
       false, 0, 2147483647},
  };
  t.insert(t.end(), tail.begin(), tail.end());
  return t;
}

[[noreturn]] void bad(const char* name, const std::string& value, const char* expected) {
  throw Error(ErrorCode::InvalidUsage, std::string(name) + "='" + value + "' is not valid: expected " +
                                           expected + " (see docs/configuration.md)");
}

}  // namespace

std::string first_slurm_host(const std::string& list) {
  // The first entry of a Slurm host list ("node[07-09,12],gpu1" -> "node07"): up to the
  // first comma outside brackets, each bracket group replaced by its first number (its
  // zero padding kept).
  std::string out;
  std::size_t i = 0;
  while (i < list.size() && list[i] != ',') {
    if (list[i] == '[') {
      const std::size_t close = list.find(']', i);
      if (close == std::string::npos) return {};
      const std::string group = list.substr(i + 1, close - i - 1);
      const std::size_t end = group.find_first_of("-,");
      const std::string first = group.substr(0, end);
      if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos) return {};
      out += first;
      i = close + 1;
    } else if (list[i] == ']') {
      return {};
    } else {
      out += list[i++];
    }
  }
  return out;
}

std::optional<std::string> env_value(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

const std::vector<Setting>& config_table() {
  static const std::vector<Setting> table = make_table();
  return table;
}

Config Config::parse(const Lookup& lookup) {
  Config c;
  c.settings = base::Settings::parse(config_table(), lookup);
  const base::Settings& s = c.settings;
  const std::string level = s.text("BRAID_DEBUG");
  c.log_level = level == "error" ? LogLevel::error
                : level == "info"  ? LogLevel::info
                : level == "trace" ? LogLevel::trace
                                   : LogLevel::warn;
  c.timeout = s.duration("BRAID_TIMEOUT");
  c.algo = base::lower(s.text("BRAID_ALGO"));
  c.tune_measure = s.text("BRAID_TUNE") == "measure";
  c.codec = base::lower(s.text("BRAID_CODEC"));
  c.codec_max_error = s.real("BRAID_CODEC_MAX_ERROR");
  c.link_probe = s.boolean("BRAID_LINK_PROBE");
  c.transport = s.text("BRAID_TRANSPORT");
  c.chunk_bytes = s.bytes("BRAID_CHUNK_BYTES");
  c.device_chunk_bytes = s.bytes("BRAID_DEVICE_CHUNK_BYTES");
  c.device_pinned_bytes = s.bytes("BRAID_DEVICE_PINNED_BYTES");
  c.spin_us = static_cast<int>(s.integer("BRAID_SPIN_US").value_or(-1));
  c.wait_helps = s.boolean("BRAID_WAIT_HELPS");
  c.inline_bytes = s.bytes("BRAID_INLINE_BYTES");
  c.plan_cache = static_cast<std::size_t>(*s.integer("BRAID_PLAN_CACHE"));
  c.check_args = s.boolean("BRAID_CHECK_ARGS");
  c.trace_entries = static_cast<std::size_t>(*s.integer("BRAID_TRACE_ENTRIES"));
  c.trace_dir = s.text("BRAID_TRACE_DIR");
  c.metrics_port = static_cast<int>(*s.integer("BRAID_METRICS_PORT"));
  c.report_seconds = static_cast<int>(*s.integer("BRAID_REPORT_SECONDS"));
  c.deterministic = s.boolean("BRAID_DETERMINISTIC");
  c.cost_model = s.text("BRAID_COST_MODEL");
  c.ucx_library = s.text("BRAID_UCX_LIBRARY");
  c.ibverbs_library = s.text("BRAID_IBVERBS_LIBRARY");
  c.pmix_library = s.text("BRAID_PMIX_LIBRARY");
  c.nvml_library = s.text("BRAID_NVML_LIBRARY");
  c.pmix_namespace = s.text("PMIX_NAMESPACE");
  c.gpu_backend = s.text("BRAID_GPU_BACKEND");
  c.gpu_options.emulation.hw_queues = static_cast<int>(*s.integer("BRAID_EMU_HW_QUEUES"));
  c.gpu_options.emulation.hostfn_us = static_cast<int>(*s.integer("BRAID_EMU_HOSTFN_US"));
  c.gpu_options.emulation.lazy_loading = s.boolean("BRAID_EMU_LAZY_LOADING");
  // The driver's variable, which braid only reads: a value outside 1-32 is the driver's
  // business, not an error of braid's configuration; braid then assumes the default 8.
  try {
    c.gpu_options.cuda_max_connections = static_cast<int>(s.integer("CUDA_DEVICE_MAX_CONNECTIONS").value_or(8));
  } catch (const Error&) {
  }
  {
    const std::string path = base::lower(s.text("BRAID_DEVICE_PATH"));
    c.device_path = path == "staged" ? Config::DevicePath::staged : Config::DevicePath::stream;
  }
  c.auth_token = s.text("BRAID_AUTH_TOKEN");
  c.tls = s.boolean("BRAID_TLS");
  c.tls_files = {s.text("BRAID_TLS_CERT"), s.text("BRAID_TLS_KEY"), s.text("BRAID_TLS_CA")};
  c.host_id = s.text("BRAID_HOST_ID");
  c.store_external = s.boolean("BRAID_STORE_EXTERNAL");

  // Launch variables: the first family that provides a rank wins; only its variables are
  // read (a malformed variable of another launcher is not an error).
  auto opt_int = [&](const char* name) -> std::optional<int> {
    if (name == nullptr) return std::nullopt;
    const auto v = s.integer(name);
    if (!v) return std::nullopt;
    return static_cast<int>(*v);
  };
  struct Family { const char* name; const char* rank; const char* size; const char* lrank; const char* lsize; };
  static constexpr Family families[] = {
      {"braid", "BRAID_RANK", "BRAID_WORLD_SIZE", "BRAID_LOCAL_RANK", "BRAID_LOCAL_SIZE"},
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
      {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
  };
  for (const auto& f : families) {
    if (!s.given(f.rank)) continue;
    c.launcher = f.name;
    c.rank = opt_int(f.rank);
    c.world_size = opt_int(f.size);
    c.local_rank = opt_int(f.lrank);
    c.local_size = opt_int(f.lsize);
    break;
  }
  c.master_addr = s.given("BRAID_MASTER_ADDR") ? s.text("BRAID_MASTER_ADDR") : s.text("MASTER_ADDR");
  c.master_port = opt_int("BRAID_MASTER_PORT");
  if (!c.master_port) c.master_port = opt_int("MASTER_PORT");
  c.torch_agent_store = s.text("TORCHELASTIC_USE_AGENT_STORE") == "True";
  // Under srun with no address given, the store is on the step's first node (rank 0's,
  // with Slurm's default block distribution) at a port derived from the job id, so
  // `srun prog` needs no variable (BRAID_MASTER_ADDR/PORT still override). Under
  // `srun --mpi=pmix` PMIx gives the exact address instead (no guessed port).
  if (c.launcher == "slurm" && c.pmix_namespace.empty()) {
    if (c.master_addr.empty()) {
      const char* var = s.given("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
      if (s.given(var)) {
        c.master_addr = first_slurm_host(s.text(var));
        if (c.master_addr.empty()) bad(var, s.text(var), "a Slurm host list");
      }
    }
    if (!c.master_port) {
      if (auto job = opt_int("SLURM_JOB_ID")) c.master_port = 15000 + *job % 10000;
    }
  }
  return c;
}

namespace {
base::LogLevel level_from_config() noexcept {
  try {
    return Config::global().log_level;
  } catch (...) {
    return base::LogLevel::warn;  // a bad BRAID_DEBUG is reported where the config is used
  }
}
// base's logging asks this for the level at its first message (base reads no variable).
[[maybe_unused]] const bool g_log_level_source = (base::set_log_level_source(&level_from_config), true);
}  // namespace

const Config& Config::global() {
  static const Config config = parse([](const char* name) { return env_value(name); });
  return config;
}

gpu::Runtime& gpu_runtime() { return gpu::runtime(Config::global().gpu_backend, Config::global().gpu_options); }

std::shared_ptr<const base::tls::Context> tls_context(const Config& cfg) {
  if (!cfg.tls) return nullptr;
  // Loaded once per set of files: every communicator and store of the process shares it.
  static std::mutex mu;
  static std::map<std::tuple<std::string, std::string, std::string>, std::shared_ptr<const base::tls::Context>> made;
  std::lock_guard<std::mutex> lock(mu);
  auto& ctx = made[{cfg.tls_files.cert, cfg.tls_files.key, cfg.tls_files.ca}];
  if (!ctx) ctx = std::make_shared<const base::tls::Context>(cfg.tls_files);
  return ctx;
}

}  // namespace braid::core
