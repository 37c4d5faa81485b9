// The configuration table and its one parse. This is the only file in braid that
// reads the environment.
#include "core/config.hpp"

#include "base/check.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <limits>

namespace braid::core {

namespace {

using Lookup = std::function<std::optional<std::string>(const char*)>;

// The table. Keep in documentation order; docs/configuration.md is generated from it.
const std::vector<ConfigVar> kTable = {
    {"BRAID_DEBUG", "enum", "WARN", "Log level: ERROR, WARN, INFO or TRACE.", true},
    {"BRAID_TIMEOUT", "duration", "300s",
     "Deadline of every collective and of connection set-up (e.g. 30s, 500ms, 5m).", true},
    {"BRAID_ALGO", "enum", "auto",
     "All-reduce algorithm: auto (the tuner prices every plan with the cost model), ring, tree, rhd or hier.",
     true},
    {"BRAID_TUNE", "enum", "measure",
     "How auto chooses among the algorithms the cost model finds plausible (within 4x of its best): "
     "measure (the first calls of each size try each in turn, then all ranks take the fastest "
     "measured) or model (the model's cheapest, no trials). Must be the same on every rank. "
     "docs/cost-model.md.",
     true},
    {"BRAID_COST_MODEL", "string", "",
     "File with the tuner's cost-model constants (α, β per link class, γ), as written by the "
     "calibration; default: constants measured on the development machine (docs/cost-model.md). "
     "Must be the same on every rank.",
     true},
    {"BRAID_CODEC", "string", "none",
     "Compression codec of all-reduces that do not name one: none, fp16, bf16, fp8e4m3, fp8e5m2, "
     "int8, int4, sign1, topk:RATIO or auto, with optional suffixes (docs/codecs.md).",
     true},
    {"BRAID_CODEC_MAX_ERROR", "float", "0.004",
     "Error budget of codec auto: only codecs whose worst-case error relative to the block's "
     "largest value is at most this are considered (0.004 admits fp16, bf16 and int8).",
     true},
    {"BRAID_TRANSPORT", "enum", "auto",
     "Transport for every pair: auto (shm between ranks of one host, tcp between hosts), tcp or shm.", true},
    {"BRAID_DETERMINISTIC", "bool", "0",
     "Reduce in fixed rank order so results are bitwise identical across algorithms and layouts "
     "(costs latency; also per call).",
     true},
    {"BRAID_CHUNK_BYTES", "bytes", "512K",
     "Pipeline slice: large collectives move in slices of at most this many bytes so that "
     "send, receive and reduce overlap.",
     true},
    {"BRAID_SPIN_US", "int", "auto",
     "Microseconds the progress thread polls without progress before it sleeps in epoll. auto: 100 "
     "when the host has a core per local rank (launcher's local size), else 0, because spinning "
     "ranks steal the cores their peers need.",
     true},
    {"BRAID_WAIT_HELPS", "bool", "0",
     "1: a thread waiting for a Work drives the progress engine itself (until its work is done "
     "or nothing moves for a while) instead of sleeping until the engine thread wakes it. Off by "
     "default: with 2 ranks on 2 cores a 4 KiB all-reduce took 4.2-9.5 us with it against 3.1 us "
     "without (docs/performance.md); no difference at 64 MiB or with more ranks than cores.",
     true},
    {"BRAID_INLINE_BYTES", "bytes", "64K",
     "Collectives of at most this many bytes (count x element size) that find the progress engine "
     "idle run on the calling "
     "thread (until done, or until nothing has moved for the spin time, when the engine thread takes "
     "over), saving the two thread hand-offs that dominate small-message latency. 0: always the "
     "engine thread.",
     true},
    {"BRAID_PLAN_CACHE", "int", "64", "Plans kept per communicator (0 disables the cache).", true},
    {"BRAID_CHECK_ARGS", "bool", "0",
     "Debug mode: before each collective, check that every rank called the same collective with "
     "the same count, type and op, and name the rank that differs.",
     true},
    {"BRAID_SOCKET_IFNAME", "string", "",
     "Network interface whose IPv4 address TCP binds and advertises (default: chosen from the "
     "master address).",
     true},
    {"BRAID_SOCKETS_PER_PEER", "int", "2", "TCP sockets per peer; large messages are striped across them.",
     true},
    {"BRAID_SOCKET_BUFFER", "bytes", "0", "SO_SNDBUF/SO_RCVBUF of TCP sockets (0: OS autotuning).", true},
    {"BRAID_SHM_SLOT_BYTES", "bytes", "512K",
     "Shared memory: bytes per ring slot (a multiple of 4K); messages move in parts of this size.", true},
    {"BRAID_SHM_SLOTS", "int", "8",
     "Shared memory: slots per ring; each pair of ranks uses about 2 x slots x slot bytes of /dev/shm.", true},
    {"BRAID_AUTH_TOKEN", "string", "",
     "Shared secret every connection must present (default: a random token agreed through the store).",
     true},
    {"BRAID_HOST_ID", "string", "", "Overrides the host identity (hostname + boot id), to emulate hosts.",
     true},
    {"BRAID_RANK", "int", "", "This process's rank (set by braidrun).", true},
    {"BRAID_WORLD_SIZE", "int", "", "Number of ranks (set by braidrun).", true},
    {"BRAID_LOCAL_RANK", "int", "", "Rank among the ranks of this host.", true},
    {"BRAID_LOCAL_SIZE", "int", "", "Number of ranks on this host.", true},
    {"BRAID_MASTER_ADDR", "string", "", "Address of the bootstrap store (rank 0 serves it).", true},
    {"BRAID_MASTER_PORT", "int", "", "Port of the bootstrap store.", true},
    {"BRAID_STORE_EXTERNAL", "bool", "0",
     "The store at BRAID_MASTER_ADDR:PORT is served by someone else (braidrun); rank 0 does not "
     "start one.",
     true},
    {"RANK", "int", "", "torchrun: rank (used when BRAID_RANK is unset).", false},
    {"WORLD_SIZE", "int", "", "torchrun: world size.", false},
    {"LOCAL_RANK", "int", "", "torchrun: local rank.", false},
    {"LOCAL_WORLD_SIZE", "int", "", "torchrun: local world size.", false},
    {"MASTER_ADDR", "string", "", "torchrun: store address (used when BRAID_MASTER_ADDR is unset).", false},
    {"MASTER_PORT", "int", "", "torchrun: store port.", false},
    {"TORCHELASTIC_USE_AGENT_STORE", "string", "",
     "torchrun: True when its elastic agent serves a torch store at MASTER_ADDR:MASTER_PORT; the Python "
     "package then bootstraps through torch's store.",
     false},
    {"OMPI_COMM_WORLD_RANK", "int", "", "Open MPI (mpirun): rank.", false},
    {"OMPI_COMM_WORLD_SIZE", "int", "", "Open MPI (mpirun): world size.", false},
    {"OMPI_COMM_WORLD_LOCAL_RANK", "int", "", "Open MPI (mpirun): local rank.", false},
    {"OMPI_COMM_WORLD_LOCAL_SIZE", "int", "", "Open MPI (mpirun): local size.", false},
    {"SLURM_PROCID", "int", "", "Slurm (srun): rank.", false},
    {"SLURM_NTASKS", "int", "", "Slurm (srun): world size.", false},
    {"SLURM_LOCALID", "int", "", "Slurm (srun): local rank.", false},
    {"SLURM_STEP_NODELIST", "string", "",
     "Slurm (srun): the step's nodes; its first node, where rank 0 runs, is the store's host when "
     "BRAID_MASTER_ADDR and MASTER_ADDR are unset (else SLURM_JOB_NODELIST's first node).",
     false},
    {"SLURM_JOB_NODELIST", "string", "", "Slurm: the job's nodes (used when SLURM_STEP_NODELIST is unset).", false},
    {"SLURM_JOB_ID", "int", "",
     "Slurm: job id; the store's port is 15000 + (job id mod 10000) when BRAID_MASTER_PORT and "
     "MASTER_PORT are unset.",
     false},
};

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

namespace {

std::string upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
  return s;
}
std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::optional<long long> parse_int(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end == s.c_str() || *end != '\0') return std::nullopt;
  return v;
}

struct Reader {
  const Lookup& lookup;

  std::optional<std::string> raw(const char* name) const {
    auto v = lookup(name);
    if (v && v->empty()) return std::nullopt;
    return v;
  }
  void str(const char* name, std::string& out) const {
    if (auto v = raw(name)) out = *v;
  }
  void integer(const char* name, int& out, long long lo, long long hi) const {
    if (auto v = raw(name)) {
      auto n = parse_int(*v);
      if (!n || *n < lo || *n > hi) bad(name, *v, ("an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]").c_str());
      out = static_cast<int>(*n);
    }
  }
  std::optional<int> opt_int(const char* name, long long lo, long long hi) const {
    int v = 0;
    if (!raw(name)) return std::nullopt;
    integer(name, v, lo, hi);
    return v;
  }
  void real(const char* name, double& out, double lo, double hi) const {
    if (auto v = raw(name)) {
      char* end = nullptr;
      const double d = std::strtod(v->c_str(), &end);
      if (end == v->c_str() || *end != '\0' || !(d >= lo && d <= hi))
        bad(name, *v, ("a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]").c_str());
      out = d;
    }
  }
  void boolean(const char* name, bool& out) const {
    if (auto v = raw(name)) {
      const std::string l = lower(*v);
      if (l == "1" || l == "true" || l == "yes" || l == "on") out = true;
      else if (l == "0" || l == "false" || l == "no" || l == "off") out = false;
      else bad(name, *v, "0/1, true/false, yes/no or on/off");
    }
  }
  void bytes(const char* name, std::size_t& out) const {
    if (auto v = raw(name)) {
      auto b = parse_bytes(*v);
      if (!b) bad(name, *v, "a byte count such as 65536, 512K, 4M or 1G");
      out = *b;
    }
  }
  void duration(const char* name, std::chrono::milliseconds& out) const {
    if (auto v = raw(name)) {
      auto d = parse_duration(*v);
      if (!d || d->count() <= 0) bad(name, *v, "a positive duration such as 30 (seconds), 30s, 500ms, 5m or 1h");
      out = *d;
    }
  }
};

}  // namespace

std::optional<std::size_t> parse_bytes(const std::string& s) {
  if (s.empty()) return std::nullopt;
  std::size_t mult = 1;
  std::string digits = s;
  const char last = static_cast<char>(std::toupper(static_cast<unsigned char>(s.back())));
  if (last == 'B' && s.size() > 1) digits.pop_back();
  const char unit = digits.empty() ? '\0' : static_cast<char>(std::toupper(static_cast<unsigned char>(digits.back())));
  if (unit == 'K') mult = 1ull << 10;
  else if (unit == 'M') mult = 1ull << 20;
  else if (unit == 'G') mult = 1ull << 30;
  else if (unit == 'T') mult = 1ull << 40;
  if (mult != 1) digits.pop_back();
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); }))
    return std::nullopt;
  errno = 0;
  const unsigned long long v = std::strtoull(digits.c_str(), nullptr, 10);
  if (errno != 0 || v > std::numeric_limits<std::size_t>::max() / mult) return std::nullopt;
  return static_cast<std::size_t>(v * mult);
}

std::optional<std::chrono::milliseconds> parse_duration(const std::string& s) {
  std::size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return std::nullopt;
  char* end = nullptr;
  const std::string num = s.substr(0, i);
  const double v = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size() || v < 0) return std::nullopt;
  const std::string unit = lower(s.substr(i));
  double ms = 0;
  if (unit.empty() || unit == "s") ms = v * 1000;
  else if (unit == "ms") ms = v;
  else if (unit == "us") ms = v / 1000;
  else if (unit == "m" || unit == "min") ms = v * 60'000;
  else if (unit == "h") ms = v * 3'600'000;
  else return std::nullopt;
  if (ms > 1e15) return std::nullopt;
  return std::chrono::milliseconds(static_cast<long long>(ms + 0.5));
}

std::optional<std::string> env_value(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

const std::vector<ConfigVar>& config_table() { return kTable; }

Config Config::parse(const Lookup& lookup) {
  Config c;
  const Reader r{lookup};
  if (auto v = r.raw("BRAID_DEBUG")) {
    const std::string u = upper(*v);
    if (u == "ERROR") c.log_level = LogLevel::error;
    else if (u == "WARN" || u == "WARNING") c.log_level = LogLevel::warn;
    else if (u == "INFO") c.log_level = LogLevel::info;
    else if (u == "TRACE") c.log_level = LogLevel::trace;
    else bad("BRAID_DEBUG", *v, "ERROR, WARN, INFO or TRACE");
  }
  r.duration("BRAID_TIMEOUT", c.timeout);
  if (auto v = r.raw("BRAID_ALGO")) c.algo = lower(*v);
  if (auto v = r.raw("BRAID_TUNE")) {
    const std::string t = lower(*v);
    if (t == "measure") c.tune_measure = true;
    else if (t == "model") c.tune_measure = false;
    else bad("BRAID_TUNE", *v, "measure or model");
  }
  if (auto v = r.raw("BRAID_CODEC")) c.codec = lower(*v);
  r.real("BRAID_CODEC_MAX_ERROR", c.codec_max_error, 0.0, 1.0);
  if (auto v = r.raw("BRAID_TRANSPORT")) {
    c.transport = lower(*v);
    if (c.transport != "auto" && c.transport != "tcp" && c.transport != "shm")
      bad("BRAID_TRANSPORT", *v, "auto, tcp or shm");
  }
  r.bytes("BRAID_CHUNK_BYTES", c.chunk_bytes);
  if (c.chunk_bytes < 4096) bad("BRAID_CHUNK_BYTES", std::to_string(c.chunk_bytes), "at least 4K");
  if (auto v = r.raw("BRAID_SPIN_US"); v && lower(*v) != "auto") r.integer("BRAID_SPIN_US", c.spin_us, 0, 10'000'000);
  r.boolean("BRAID_WAIT_HELPS", c.wait_helps);
  r.bytes("BRAID_INLINE_BYTES", c.inline_bytes);
  int cache = static_cast<int>(c.plan_cache);
  r.integer("BRAID_PLAN_CACHE", cache, 0, 1'000'000);
  c.plan_cache = static_cast<std::size_t>(cache);
  r.boolean("BRAID_CHECK_ARGS", c.check_args);
  r.boolean("BRAID_DETERMINISTIC", c.deterministic);
  r.str("BRAID_COST_MODEL", c.cost_model);
  r.str("BRAID_SOCKET_IFNAME", c.socket_ifname);
  r.integer("BRAID_SOCKETS_PER_PEER", c.sockets_per_peer, 1, 64);
  r.bytes("BRAID_SOCKET_BUFFER", c.socket_buffer);
  r.bytes("BRAID_SHM_SLOT_BYTES", c.shm_slot_bytes);
  if (c.shm_slot_bytes < 4096 || c.shm_slot_bytes % 4096 != 0)
    bad("BRAID_SHM_SLOT_BYTES", std::to_string(c.shm_slot_bytes), "a multiple of 4K, at least 4K");
  r.integer("BRAID_SHM_SLOTS", c.shm_slots, 1, 4096);
  r.str("BRAID_AUTH_TOKEN", c.auth_token);
  r.str("BRAID_HOST_ID", c.host_id);
  r.boolean("BRAID_STORE_EXTERNAL", c.store_external);

  // Launch variables: the first family that provides a rank wins.
  constexpr long long kMaxRanks = 1 << 24;
  struct Family { const char* name; const char* rank; const char* size; const char* lrank; const char* lsize; };
  static constexpr Family families[] = {
      {"braid", "BRAID_RANK", "BRAID_WORLD_SIZE", "BRAID_LOCAL_RANK", "BRAID_LOCAL_SIZE"},
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
      {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
  };
  for (const auto& f : families) {
    if (!r.raw(f.rank)) continue;
    c.launcher = f.name;
    c.rank = r.opt_int(f.rank, 0, kMaxRanks - 1);
    c.world_size = r.opt_int(f.size, 1, kMaxRanks);
    c.local_rank = r.opt_int(f.lrank, 0, kMaxRanks - 1);
    if (f.lsize) c.local_size = r.opt_int(f.lsize, 1, kMaxRanks);
    break;
  }
  if (auto v = r.raw("BRAID_MASTER_ADDR")) c.master_addr = *v;
  else if (auto m = r.raw("MASTER_ADDR")) c.master_addr = *m;
  c.master_port = r.opt_int("BRAID_MASTER_PORT", 1, 65535);
  if (!c.master_port) c.master_port = r.opt_int("MASTER_PORT", 1, 65535);
  if (auto v = r.raw("TORCHELASTIC_USE_AGENT_STORE")) c.torch_agent_store = *v == "True";
  // Under srun with no address given, the store is on the step's first node (rank 0's,
  // with Slurm's default block distribution) at a port derived from the job id, so
  // `srun prog` needs no variable (BRAID_MASTER_ADDR/PORT still override).
  if (c.launcher == "slurm") {
    if (c.master_addr.empty()) {
      auto nodes = r.raw("SLURM_STEP_NODELIST");
      if (!nodes) nodes = r.raw("SLURM_JOB_NODELIST");
      if (nodes) {
        c.master_addr = first_slurm_host(*nodes);
        if (c.master_addr.empty()) bad("SLURM_STEP_NODELIST/SLURM_JOB_NODELIST", *nodes, "a Slurm host list");
      }
    }
    if (!c.master_port) {
      if (auto job = r.opt_int("SLURM_JOB_ID", 0, std::numeric_limits<int>::max()))
        c.master_port = 15000 + *job % 10000;
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

}  // namespace braid::core
