// braid_soak: many mixed collectives on forked rank processes, every result checked, the
// processes' resources sampled as it goes (docs/reliability.md, "Soak").
//
// What it proves: over N operations of random collective, size, element type, reduction,
// algorithm, codec and async depth, on W real processes over the default transport
// (shared memory between ranks of one host), every result equals a reference computed
// locally, and resources stay flat: no open file, thread or shared-memory segment is
// gained after warm-up, and resident memory grows by at most 1% (--rss-tolerance).
//
// How:
// - The parent forks W ranks; each joins one communicator over a FileStore in a fresh temp
//   directory. Every rank draws the same schedule from one seeded generator (so all agree
//   on the sequence of calls): batches of 1..8 operations (the async depth) are posted
//   back to back, each into its own pre-allocated buffers, then waited in order and
//   checked.
// - Inputs are a pure function of (seed, operation, rank, element), so each rank computes
//   every rank's input and thus the exact expected output of its own part:
//     exact   floats whose sums, products and averages are exact in every type (quarters in
//             [-2, 2], products of {±1/2, ±1, ±2}): any reduction order gives the same bits;
//     det     random floats with AllreduceOptions::deterministic (or min/max): the reference
//             folds rank 0, 1, ..., W-1 in the element type, as docs/algorithms.md specifies;
//     tol     random floats, sum/avg in any order: within 2·W·u·Σ|x| of the exact sum, and
//             identical on every rank (a running hash of the outputs is compared at every
//             sample);
//     int     random bits of the integer type (wrapping sums and products are exact);
//     bits    random bytes that only move (broadcast, allgather, alltoall, send/recv):
//             compared bit for bit.
//   Compressed all-reduces (f32, sum/avg, every codec, error feedback under a few keys per
//   codec) are checked element by element against compression::reference_allreduce, the
//   library's single-process reference of the algorithm, which each rank runs for all W
//   ranks with its own copy of every rank's residuals (on one emulated host only: across
//   hosts the compression is hierarchical and only the cross-rank hash applies).
//   Out-of-place inputs must be unchanged afterwards, 64 guard bytes after
//   every output must be untouched, and a non-root's reduce buffer must not be written.
// - Every --sample-every operations (default 10,000, or a tenth of a shorter run; and at
//   the start and end) each rank reads its VmRSS, RssAnon, RssShmem and Threads
//   (/proc/self/status), the bytes malloc has handed out (mallinfo2), its open fds
//   (/proc/self/fd), the /dev/shm segments it maps (/proc/self/maps) and the /dev/shm
//   entries left under its communicator's names; one all-gather brings them to rank 0,
//   which prints a row. The baseline is the first sample at or after the warm-up (--warmup:
//   10,000 operations, or half of a shorter run); from there to the end, on every rank, fds,
//   threads, shm mappings and shm entries may not grow at all, and VmRSS by at most
//   --rss-tolerance percent (1).
//   Why after a warm-up: the first calls build what later ones reuse (connections and their
//   shm rings, plans, the tuner's choices, error-feedback residuals, the engine's scratch
//   pool at its high-water mark); a prologue runs every collective once at the largest size
//   so that most of it is built early. Why VmRSS may move at all: the tuner keeps a choice
//   for every shape it has met (bounded by the shapes there are, but a random schedule
//   keeps meeting new ones), and malloc's free lists move by a few hundred KiB. A leak of
//   20 bytes per operation still crosses 1% over 90,000 operations. The ranks fix glibc's
//   mmap threshold at 128 KiB (mallopt) so that freed large blocks leave VmRSS at once
//   instead of staying in the heap (see run_rank).
// Exit status: 0 when every result was right, no call failed and resources stayed flat;
// 1 otherwise, with the operation index, collective, parameters and rank of each failure.
// --inject makes one of these faults on purpose, to show that the checks catch it.
#include <braid/braid.hpp>

#include "collectives/cost.hpp"
#include "collectives/plan.hpp"
#include "collectives/tuner.hpp"
#include "compression/codec.hpp"
#include "compression/error_feedback.hpp"
#include "compression/reference.hpp"
#include "kernels/host/codec_kernels.hpp"
#include "kernels/host/reduce.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

using namespace braid;
using Clock = std::chrono::steady_clock;

// ---- settings ---------------------------------------------------------------------------

struct Settings {
  std::uint64_t ops = 2000;
  std::uint64_t seed = 1;
  int ranks = 4;
  std::uint64_t sample_every = 0;  // 0: 10,000, or ops/10 when that is fewer
  std::uint64_t warmup = 0;        // 0: 10,000, or half the run when that is fewer
  std::size_t max_bytes = std::size_t{4} << 20;
  int max_depth = 8;
  int hosts = 1;
  std::string transport;
  double rss_tolerance = 1.0;    // percent
  int timeout_s = 7200;          // the whole run (the parent kills the ranks after it)
  int op_timeout_s = 120;        // every collective's deadline
  int max_reports = 20;          // wrong results printed per rank
  std::string only;              // comma-separated collectives to run (empty: all)
  int slow_ms = 0;               // > 0: rank 0 prints every operation that took longer
  std::string inject;            // a fault to show that the checks catch it (see usage)
  std::size_t tuned_shapes = 0;  // > 0: tuned calls draw their shapes from menus of this many
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(
      stderr,
      "braid_soak: %s\n"
      "usage: braid_soak [--ops N] [--seed S] [--ranks W] [--sample-every K] [--warmup K]\n"
      "                  [--max-bytes B] [--max-depth D] [--hosts H] [--transport NAME]\n"
      "                  [--rss-tolerance PERCENT] [--timeout SECONDS] [--op-timeout SECONDS]\n"
      "                  [--only allreduce,compressed,broadcast,reduce,allgather,reduce_scatter,alltoall,\n"
      "                          ring,pair,barrier] [--slow-ms MS]\n"
      "                  [--tuned-shapes N]  (automatic all-reduces, broadcasts and reduces draw count, type,\n"
      "                   op, determinism and root from a menu of N shapes each, as a training job\n"
      "                   repeats its buckets; default: every call draws its own)\n"
      "                  [--inject wrong|fd|thread|rss|shm]  (a fault half way, on the last rank:\n"
      "                   a flipped output byte, or a leaked fd, thread, 3%% of VmRSS or shm mapping;\n"
      "                   the run must then fail)\n",
      why);
  std::exit(2);
}

Settings parse_args(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    auto number = [&]() -> std::uint64_t {
      const std::string v = value();
      char* end = nullptr;
      const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0') usage(("not a number: " + a + " " + v).c_str());
      return n;
    };
    if (a == "--ops")
      s.ops = number();
    else if (a == "--seed")
      s.seed = number();
    else if (a == "--ranks")
      s.ranks = static_cast<int>(number());
    else if (a == "--sample-every")
      s.sample_every = number();
    else if (a == "--warmup")
      s.warmup = number();
    else if (a == "--max-bytes")
      s.max_bytes = number();
    else if (a == "--max-depth")
      s.max_depth = static_cast<int>(number());
    else if (a == "--hosts")
      s.hosts = static_cast<int>(number());
    else if (a == "--transport")
      s.transport = value();
    else if (a == "--rss-tolerance")
      s.rss_tolerance = std::atof(value().c_str());
    else if (a == "--timeout")
      s.timeout_s = static_cast<int>(number());
    else if (a == "--op-timeout")
      s.op_timeout_s = static_cast<int>(number());
    else if (a == "--slow-ms")
      s.slow_ms = static_cast<int>(number());
    else if (a == "--inject")
      s.inject = value();
    else if (a == "--tuned-shapes")
      s.tuned_shapes = number();
    else if (a == "--only")
      s.only = "," + value() + ",";
    else if (a == "--help" || a == "-h")
      usage("help");
    else
      usage(("unknown argument " + a).c_str());
  }
  if (s.ranks < 1 || s.ranks > 64) usage("--ranks must be in [1, 64]");
  if (s.hosts < 1 || s.ranks % s.hosts != 0) usage("--hosts must divide --ranks");
  if (s.max_depth < 1 || s.max_depth > 64) usage("--max-depth must be in [1, 64]");
  if (s.max_bytes < 4096) usage("--max-bytes must be at least 4096");
  if (!s.inject.empty() && s.inject != "wrong" && s.inject != "fd" && s.inject != "thread" && s.inject != "rss" &&
      s.inject != "shm")
    usage(("unknown fault " + s.inject).c_str());
  if (s.sample_every == 0) s.sample_every = std::max<std::uint64_t>(1, std::min<std::uint64_t>(10000, s.ops / 10));
  if (s.warmup == 0) s.warmup = std::min<std::uint64_t>(10000, std::max<std::uint64_t>(s.sample_every, s.ops / 2));
  return s;
}

// ---- random numbers -------------------------------------------------------------------

constexpr std::uint64_t kGolden = 0x9e3779b97f4a7c15ull;

std::uint64_t mix64(std::uint64_t x) {
  x += kGolden;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The schedule's generator (splitmix64): the same on every rank.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : s_(mix64(seed)) {}
  std::uint64_t next() { return mix64(s_ += kGolden); }
  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : next() % n; }
  std::uint64_t between(std::uint64_t lo, std::uint64_t hi) { return lo + below(hi - lo + 1); }  // inclusive
  double uniform() { return static_cast<double>(next() >> 11) * 0x1p-53; }
  bool chance(double p) { return uniform() < p; }

 private:
  std::uint64_t s_;
};

// ---- the operations -------------------------------------------------------------------

enum class Kind {
  allreduce,
  compressed,
  broadcast,
  reduce,
  allgather,
  reduce_scatter,
  alltoall,
  exchange,
  pair,
  barrier
};
constexpr int kKinds = 10;
// Names for --only.
const char* kind_flag(Kind k) {
  static const char* names[kKinds] = {"allreduce",      "compressed", "broadcast", "reduce", "allgather",
                                      "reduce_scatter", "alltoall",   "ring",      "pair",   "barrier"};
  return names[static_cast<int>(k)];
}
const char* kind_name(Kind k) {
  static const char* names[kKinds] = {"allreduce",      "allreduce+codec", "broadcast", "reduce",
                                      "allgather",      "reduce_scatter",  "alltoall",  "send/recv ring",
                                      "send/recv pair", "barrier"};
  return names[static_cast<int>(k)];
}

enum class Values { exact, det, tol, integer, bits, gaussian };
const char* values_name(Values v) {
  static const char* names[] = {"exact", "det", "tol", "int", "bits", "gaussian"};
  return names[static_cast<int>(v)];
}

struct Op {
  std::uint64_t index = 0;
  Kind kind = Kind::barrier;
  DataType dtype = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  Algorithm algorithm = Algorithm::automatic;
  std::string codec;
  std::string ef_key;
  std::uint64_t codec_step = 0;  // the RNG step the communicator gives this compressed call
  std::size_t count = 0;
  int root = 0;  // broadcast/reduce root; pair: the sender
  int peer = 0;  // pair: the receiver; ring: the shift (rank r sends to r + shift)
  std::uint32_t tag = 0;
  bool in_place = false;
  bool deterministic = false;
  bool null_other = false;  // non-roots pass nullptr for the buffer they do not use
  bool recv_first = false;  // send/recv ring: post the receive first
  Values values = Values::bits;
  std::uint64_t key = 0;  // inputs: element i of rank r is a function of (key, r, i)
};

std::string describe(const Op& o) {
  std::ostringstream os;
  os << "op #" << o.index << " " << kind_name(o.kind) << "(count " << o.count;
  if (o.kind != Kind::barrier) os << ", " << to_string(o.dtype);
  if (o.kind == Kind::allreduce || o.kind == Kind::compressed || o.kind == Kind::reduce ||
      o.kind == Kind::reduce_scatter)
    os << ", " << to_string(o.op);
  if (o.kind == Kind::allreduce) os << ", algo " << to_string(o.algorithm);
  if (o.kind == Kind::compressed) {
    os << ", codec " << o.codec << ", step " << o.codec_step;
    if (!o.ef_key.empty()) os << ", ef_key " << o.ef_key;
  }
  if (o.kind == Kind::broadcast || o.kind == Kind::reduce) os << ", root " << o.root;
  if (o.kind == Kind::pair) os << ", " << o.root << " -> " << o.peer << ", tag " << o.tag;
  if (o.kind == Kind::exchange) os << ", shift " << o.peer << ", tag " << o.tag << (o.recv_first ? ", recv first" : "");
  if (o.deterministic) os << ", deterministic";
  if (o.in_place) os << ", in place";
  if (o.null_other) os << ", null on others";
  if (o.kind != Kind::barrier) os << ", values " << values_name(o.values);
  os << ")";
  return os.str();
}

struct CodecChoice {
  const char* name;
  bool needs_ef;
};
const CodecChoice kCodecs[] = {{"fp16", false},    {"bf16", false},    {"fp8e4m3", false},  {"fp8e5m2", false},
                               {"int8", false},    {"int8:sr", false}, {"int4", false},     {"int4:block=64", false},
                               {"int4:sr", false}, {"sign1", true},    {"topk:0.01", true}, {"topk:0.1", true},
                               {"mxfp8", false},   {"mxfp4", true}};
constexpr int kEfKeysPerCodec = 2;

// The sequence of operations, the same on every rank. Element counts lean towards small
// (latency-bound calls are where the engine's bookkeeping runs most often), with a tail
// up to --max-bytes per rank buffer.
class Schedule {
 public:
  Schedule(const Settings& s, int world) : s_(s), world_(world), rng_(s.seed) {
    static const int weights[kKinds] = {30, 12, 8, 8, 8, 8, 8, 8, 5, 5};
    for (int k = 0; k < kKinds; ++k) {
      const bool on =
          s.only.empty() || s.only.find(std::string(",") + kind_flag(static_cast<Kind>(k)) + ",") != std::string::npos;
      weights_[k] = on ? weights[k] : 0;
      total_ += weights_[k];
    }
    if (total_ == 0) usage(("--only names no collective: " + s.only).c_str());
    // Every error-feedback key has one count for the whole run (the library's rule).
    for (const auto& c : kCodecs)
      for (int k = 0; k < kEfKeysPerCodec; ++k) ef_counts_[ef_key(c.name, k)] = pick_count(4, 1, std::size_t{1} << 16);
    for (int m = 0; m < 3 && s.tuned_shapes > 0; ++m)
      for (std::size_t i = 0; i < s.tuned_shapes; ++i) {
        Shape sh;
        sh.dtype = pick_dtype();
        sh.op = m == 1 ? ReduceOp::sum : static_cast<ReduceOp>(rng_.below(kNumReduceOps));
        sh.deterministic = m != 1 && rng_.chance(0.25);
        sh.root = m == 0 ? 0 : static_cast<int>(rng_.below(static_cast<std::uint64_t>(world_)));
        sh.count = pick_count(dtype_size(sh.dtype), 1);
        menus_[m].push_back(sh);
      }
    make_prologue();
  }

  static std::string ef_key(const char* codec, int k) { return std::string("soak/") + codec + "/" + std::to_string(k); }

  int next_depth() { return static_cast<int>(rng_.between(1, static_cast<std::uint64_t>(s_.max_depth))); }

  // The first operations (the prologue) touch what later ones reuse, so that the baseline
  // sample sees a warm process: every error-feedback key once (its residuals); alltoalls of
  // the largest size, enough to take every pair's shm rings all the way round; and every
  // collective once at the largest size (f32; all-reduce with each algorithm, each codec),
  // which takes the engine's scratch pool to its high-water mark.
  std::size_t prologue_size() const { return prologue_.size(); }
  Op next(std::uint64_t index) {
    Op o;
    o.index = index;
    o.key = mix64(s_.seed * 0x100000001b3ull ^ mix64(index));
    if (index < prologue_.size()) {
      Op p = prologue_[static_cast<std::size_t>(index)];
      p.index = o.index;
      p.key = o.key;
      if (p.kind == Kind::compressed) p.codec_step = steps_[p.ef_key]++;
      return p;
    }
    int pick = static_cast<int>(rng_.below(static_cast<std::uint64_t>(total_)));
    int k = 0;
    while (pick >= weights_[k]) pick -= weights_[k++];
    o.kind = static_cast<Kind>(k);
    switch (o.kind) {
      case Kind::allreduce:
      case Kind::reduce:
      case Kind::reduce_scatter:
        reduction(o);
        break;
      case Kind::compressed:
        compressed(o);
        break;
      case Kind::broadcast:
      case Kind::allgather:
      case Kind::alltoall:
      case Kind::exchange:
      case Kind::pair:
        movement(o);
        break;
      case Kind::barrier:
        break;
    }
    return o;
  }

 private:
  // Elements per rank block: 4% none, 8% one, 43% 2-64, 25% 65-4096, 15% 4097-65536, 5%
  // log-uniform in bytes from 256 KiB to the largest buffer (--max-bytes for all blocks).
  std::size_t pick_count(std::size_t elem, std::size_t blocks, std::size_t cap_elems = SIZE_MAX) {
    const std::size_t cap = std::min(cap_elems, s_.max_bytes / (elem * blocks));
    const double r = rng_.uniform();
    std::size_t n;
    if (r < 0.04)
      n = 0;
    else if (r < 0.12)
      n = 1;
    else if (r < 0.55)
      n = rng_.between(2, 64);
    else if (r < 0.80)
      n = rng_.between(65, 4096);
    else if (r < 0.95)
      n = rng_.between(4097, 65536);
    else {
      const double lo = std::log2(256.0 * 1024), hi = std::log2(static_cast<double>(cap * elem) + 1);
      const double bytes = std::exp2(lo + rng_.uniform() * std::max(0.0, hi - lo));
      n = static_cast<std::size_t>(bytes) / elem + rng_.below(2);  // odd counts too
    }
    return std::min(n, cap);
  }

  DataType pick_dtype() { return static_cast<DataType>(rng_.below(kNumDataTypes)); }

  void reduction(Op& o) {
    o.dtype = pick_dtype();
    o.op = static_cast<ReduceOp>(rng_.below(kNumReduceOps));
    if (o.kind == Kind::allreduce) o.algorithm = static_cast<Algorithm>(rng_.below(kNumAlgorithms));
    o.deterministic = rng_.chance(0.25);
    o.in_place = rng_.chance(0.5);
    o.root = static_cast<int>(rng_.below(static_cast<std::uint64_t>(world_)));
    o.null_other = rng_.chance(0.5);
    const double v = rng_.uniform();
    const std::size_t blocks = o.kind == Kind::reduce_scatter ? static_cast<std::size_t>(world_) : 1;
    o.count = pick_count(dtype_size(o.dtype), blocks);
    if (o.kind == Kind::reduce || (o.kind == Kind::allreduce && o.algorithm == Algorithm::automatic))
      from_menu(o, o.kind == Kind::reduce ? 2 : 0);
    // fp8's exact values stay exact in any order only up to 8 ranks (make_value): beyond,
    // the reference folds in the library's fixed order (det).
    const bool fp8 = o.dtype == DataType::f8e4m3 || o.dtype == DataType::f8e5m2;
    if (fp8 && world_ > 8) o.deterministic = true;
    if (!is_floating(o.dtype)) {
      o.values = Values::integer;
    } else if (o.deterministic || o.op == ReduceOp::min || o.op == ReduceOp::max) {
      o.values = v < 0.6 || (fp8 && world_ > 8) ? Values::det : Values::exact;
    } else if (o.kind == Kind::allreduce && (o.op == ReduceOp::sum || o.op == ReduceOp::avg)) {
      // fp8's rounding (u = 2^-4, 2^-3) is too coarse for the first-order bound of tol.
      o.values = v < 0.4 && !fp8 ? Values::tol : Values::exact;
    } else {
      o.values = Values::exact;
    }
  }

  // --tuned-shapes: the call's shape from menu m (0 automatic all-reduce, 1 broadcast, 2 reduce).
  void from_menu(Op& o, int m) {
    if (menus_[m].empty()) return;
    const Shape& sh = menus_[m][rng_.below(menus_[m].size())];
    o.dtype = sh.dtype;
    o.op = sh.op;
    o.deterministic = sh.deterministic;
    o.root = sh.root;
    o.count = sh.count;
  }

  void compressed(Op& o) {
    const auto& c = kCodecs[rng_.below(sizeof(kCodecs) / sizeof(kCodecs[0]))];
    o.dtype = DataType::f32;
    o.op = rng_.chance(0.5) ? ReduceOp::sum : ReduceOp::avg;
    o.codec = c.name;
    o.in_place = rng_.chance(0.5);
    o.values = Values::gaussian;
    if (c.needs_ef || rng_.chance(0.4)) {
      o.ef_key = ef_key(c.name, static_cast<int>(rng_.below(kEfKeysPerCodec)));
      o.count = ef_counts_.at(o.ef_key);
    } else {
      o.count = pick_count(4, 1);
    }
    o.codec_step = steps_[o.ef_key]++;  // the communicator counts compressed calls per key
  }

  void movement(Op& o) {
    o.dtype = pick_dtype();
    o.values = Values::bits;
    o.in_place = rng_.chance(0.5);
    o.null_other = rng_.chance(0.5);
    o.root = static_cast<int>(rng_.below(static_cast<std::uint64_t>(world_)));
    o.tag = static_cast<std::uint32_t>(rng_.below(1000));
    if (o.kind == Kind::pair) {
      o.peer = static_cast<int>(rng_.below(static_cast<std::uint64_t>(world_)));
      if (world_ > 1 && o.peer == o.root) o.peer = (o.peer + 1) % world_;
    }
    if (o.kind == Kind::exchange) {
      o.peer = static_cast<int>(rng_.below(static_cast<std::uint64_t>(world_)));
      o.recv_first = rng_.chance(0.5);
    }
    const bool blocks = o.kind == Kind::allgather || o.kind == Kind::alltoall;
    o.count = pick_count(dtype_size(o.dtype), blocks ? static_cast<std::size_t>(world_) : 1);
    if (o.kind == Kind::broadcast) from_menu(o, 1);
  }

  void make_prologue() {
    auto on = [&](Kind k) { return weights_[static_cast<int>(k)] > 0; };
    const std::size_t max_f32 = s_.max_bytes / 4;
    auto add = [&](Kind k, std::size_t count) -> Op& {
      Op o;
      o.kind = k;
      o.dtype = DataType::f32;
      o.op = ReduceOp::sum;
      o.values = k == Kind::compressed ? Values::gaussian : Values::exact;
      o.count = count;
      prologue_.push_back(o);
      return prologue_.back();
    };
    if (on(Kind::compressed)) {
      for (const auto& [key, count] : ef_counts_) {
        Op& o = add(Kind::compressed, count);
        o.ef_key = key;
        o.codec = key.substr(5, key.rfind('/') - 5);  // "soak/<codec>/<k>"
      }
      for (const auto& c : kCodecs)
        if (!c.needs_ef) add(Kind::compressed, max_f32).codec = c.name;
    }
    if (on(Kind::alltoall))
      for (int i = 0; i < 12; ++i) {
        Op& o = add(Kind::alltoall, s_.max_bytes / static_cast<std::size_t>(world_));
        o.dtype = DataType::u8;
        o.values = Values::bits;
      }
    // Each reduction out of place and in place: an in-place receive-and-reduce stages its
    // messages in buffers of the scratch pool, so the pool's largest buffers are these.
    for (const bool in_place : {false, true}) {
      if (on(Kind::allreduce))
        for (int a = 0; a < kNumAlgorithms; ++a) {
          Op& o = add(Kind::allreduce, max_f32);
          o.algorithm = static_cast<Algorithm>(a);
          o.in_place = in_place;
        }
      if (on(Kind::reduce)) add(Kind::reduce, max_f32).in_place = in_place;
      if (on(Kind::reduce_scatter))
        add(Kind::reduce_scatter, max_f32 / static_cast<std::size_t>(world_)).in_place = in_place;
    }
    if (on(Kind::broadcast)) add(Kind::broadcast, max_f32).values = Values::bits;
    if (on(Kind::allgather)) add(Kind::allgather, max_f32 / static_cast<std::size_t>(world_)).values = Values::bits;
  }

  const Settings& s_;
  const int world_;
  Rng rng_;
  int weights_[kKinds] = {};
  int total_ = 0;
  std::map<std::string, std::size_t> ef_counts_;
  std::map<std::string, std::uint64_t> steps_;
  std::vector<Op> prologue_;
  struct Shape {
    DataType dtype = DataType::f32;
    ReduceOp op = ReduceOp::sum;
    bool deterministic = false;
    int root = 0;
    std::size_t count = 0;
  };
  std::vector<Shape> menus_[3];
};

// ---- element types --------------------------------------------------------------------

template <DataType D>
struct Elem;

// Floating types: S is the stored type; load/store widen to and round from the type
// reductions compute in (f16/bf16 in f32, rounded back after every step, as the kernels).
template <class S>
struct FloatElem {
  using Store = S;
  static constexpr bool floating = true;
};
template <>
struct Elem<DataType::f32> : FloatElem<float> {
  static float load(float s) { return s; }
  static float store(float c) { return c; }
  static constexpr double unit = 0x1p-24;
};
template <>
struct Elem<DataType::f64> : FloatElem<double> {
  static double load(double s) { return s; }
  static double store(double c) { return c; }
  static constexpr double unit = 0x1p-53;
};
template <>
struct Elem<DataType::f16> : FloatElem<std::uint16_t> {
  static float load(std::uint16_t s) { return kernels::half_to_float(s); }
  static std::uint16_t store(float c) { return kernels::float_to_half(c); }
  static constexpr double unit = 0x1p-11;
};
template <>
struct Elem<DataType::bf16> : FloatElem<std::uint16_t> {
  static float load(std::uint16_t s) { return kernels::bf16_to_float(s); }
  static std::uint16_t store(float c) { return kernels::float_to_bf16(c); }
  static constexpr double unit = 0x1p-8;
};
template <>
struct Elem<DataType::f8e4m3> : FloatElem<std::uint8_t> {
  static float load(std::uint8_t s) { return kernels::fp8_to_float(s, kernels::BlockFormat::fp8e4m3); }
  static std::uint8_t store(float c) { return kernels::float_to_fp8(c, kernels::BlockFormat::fp8e4m3); }
  static constexpr double unit = 0x1p-4;
};
template <>
struct Elem<DataType::f8e5m2> : FloatElem<std::uint8_t> {
  static float load(std::uint8_t s) { return kernels::fp8_to_float(s, kernels::BlockFormat::fp8e5m2); }
  static std::uint8_t store(float c) { return kernels::float_to_fp8(c, kernels::BlockFormat::fp8e5m2); }
  static constexpr double unit = 0x1p-3;
};
template <class S>
struct IntElem {
  using Store = S;
  static constexpr bool floating = false;
  static constexpr double unit = 0;
};
template <>
struct Elem<DataType::i8> : IntElem<std::int8_t> {};
template <>
struct Elem<DataType::u8> : IntElem<std::uint8_t> {};
template <>
struct Elem<DataType::i32> : IntElem<std::int32_t> {};
template <>
struct Elem<DataType::i64> : IntElem<std::int64_t> {};

template <class F>
auto with_dtype(DataType t, F&& f) {
  switch (t) {
    case DataType::f32:
      return f(std::integral_constant<DataType, DataType::f32>{});
    case DataType::f64:
      return f(std::integral_constant<DataType, DataType::f64>{});
    case DataType::f16:
      return f(std::integral_constant<DataType, DataType::f16>{});
    case DataType::bf16:
      return f(std::integral_constant<DataType, DataType::bf16>{});
    case DataType::i8:
      return f(std::integral_constant<DataType, DataType::i8>{});
    case DataType::u8:
      return f(std::integral_constant<DataType, DataType::u8>{});
    case DataType::i32:
      return f(std::integral_constant<DataType, DataType::i32>{});
    case DataType::f8e4m3:
      return f(std::integral_constant<DataType, DataType::f8e4m3>{});
    case DataType::f8e5m2:
      return f(std::integral_constant<DataType, DataType::f8e5m2>{});
    case DataType::i64:
      break;
  }
  return f(std::integral_constant<DataType, DataType::i64>{});
}

template <class S>
S from_bits(std::uint64_t h) {
  S s;
  std::memcpy(&s, &h, sizeof(S));
  return s;
}

// Element `h` (a hash) of the given kind of values.
template <DataType D>
typename Elem<D>::Store make_value(std::uint64_t h, Values v, ReduceOp op) {
  using E = Elem<D>;
  using S = typename E::Store;
  if constexpr (!E::floating) {
    (void)v;
    (void)op;
    return from_bits<S>(h);
  } else {
    switch (v) {
      case Values::exact: {
        if (op == ReduceOp::prod) {
          static const float f[6] = {-2.0f, -1.0f, -0.5f, 0.5f, 1.0f, 2.0f};
          return E::store(f[h % 6]);
        }
        // fp8 keeps every partial sum of up to 8 ranks exact: multiples of 1/4 below 4
        // (e4m3, 4 significant bits) or 2 (e5m2, 3 bits).
        if constexpr (D == DataType::f8e4m3) return E::store(static_cast<float>(static_cast<int>(h % 5) - 2) * 0.25f);
        if constexpr (D == DataType::f8e5m2) return E::store(static_cast<float>(static_cast<int>(h % 3) - 1) * 0.25f);
        return E::store(static_cast<float>(static_cast<int>(h % 17) - 8) * 0.25f);
      }
      case Values::det:
      case Values::tol:
      case Values::gaussian: {
        // sign * [1, 2) * 2^[-2, 2]: no overflow even for f16 products of 4 ranks.
        const std::uint64_t e = 1021 + (h >> 1) % 5;
        const std::uint64_t bits = (h << 63) | (e << 52) | (h >> 12);
        double x;
        std::memcpy(&x, &bits, sizeof x);
        return E::store(static_cast<decltype(E::load(S{}))>(x));
      }
      case Values::integer:
      case Values::bits:
        break;
    }
    return from_bits<S>(h);
  }
}

// a (op) b as the kernels compute it (avg reduces as sum).
template <DataType D>
typename Elem<D>::Store combine(ReduceOp op, typename Elem<D>::Store a, typename Elem<D>::Store b) {
  using E = Elem<D>;
  using S = typename E::Store;
  if constexpr (E::floating) {
    const auto x = E::load(a), y = E::load(b);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
      case ReduceOp::premul_sum:  // the default scale, 1
        return E::store(x + y);
      case ReduceOp::prod:
        return E::store(x * y);
      case ReduceOp::min:
        return y < x ? b : a;
      case ReduceOp::max:
        return y > x ? b : a;
    }
    return a;
  } else {
    using U = std::make_unsigned_t<S>;
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
      case ReduceOp::premul_sum:  // the default scale, 1
        return static_cast<S>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
      case ReduceOp::prod: {
        using W = std::conditional_t<(sizeof(S) < sizeof(unsigned)), unsigned, U>;  // no signed promotion
        return static_cast<S>(static_cast<U>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b))));
      }
      case ReduceOp::min:
        return std::min(a, b);
      case ReduceOp::max:
        return std::max(a, b);
    }
    return a;
  }
}

// The final division of avg (kernels::divide's rule: floats in their compute type,
// integers truncating).
template <DataType D>
typename Elem<D>::Store divide(typename Elem<D>::Store a, int world) {
  using E = Elem<D>;
  using S = typename E::Store;
  if constexpr (E::floating) {
    using C = decltype(E::load(S{}));
    return E::store(E::load(a) / static_cast<C>(world));
  } else {
    if (world == 1) return a;
    using W = std::conditional_t<(sizeof(S) < sizeof(std::int64_t)), std::int32_t, std::int64_t>;
    return static_cast<S>(static_cast<W>(a) / static_cast<W>(world));
  }
}

template <DataType D>
double to_double(typename Elem<D>::Store s) {
  if constexpr (Elem<D>::floating)
    return static_cast<double>(Elem<D>::load(s));
  else
    return static_cast<double>(s);
}

template <DataType D>
bool same(typename Elem<D>::Store got, typename Elem<D>::Store want, bool bitwise) {
  if (bitwise || !Elem<D>::floating) return std::memcmp(&got, &want, sizeof got) == 0;
  const double g = to_double<D>(got), w = to_double<D>(want);
  return g == w || (std::isnan(g) && std::isnan(w));
}

template <DataType D>
std::string show(typename Elem<D>::Store s) {
  std::ostringstream os;
  os.precision(9);
  os << to_double<D>(s);
  std::uint64_t bits = 0;
  std::memcpy(&bits, &s, sizeof s);
  os << " (0x" << std::hex << bits << ")";
  return os.str();
}

// ---- buffers ----------------------------------------------------------------------------

constexpr std::size_t kGuard = 64;
constexpr unsigned char kGuardByte = 0xa5;
constexpr unsigned char kUntouchedByte = 0x5a;

struct AlignedBuffer {
  explicit AlignedBuffer(std::size_t n)
      : bytes(n), mem(static_cast<std::byte*>(std::aligned_alloc(64, (n + 63) / 64 * 64))) {
    if (!mem) throw std::bad_alloc();
    std::memset(mem.get(), 0, bytes);  // touched now, so that they do not grow RSS later
  }
  std::byte* get() const { return mem.get(); }
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::size_t bytes;
  std::unique_ptr<std::byte, Free> mem;
};

// One operation in flight: its buffers and what to check afterwards.
struct Slot {
  explicit Slot(std::size_t max_bytes) : send(max_bytes + kGuard), recv(max_bytes + kGuard) {}
  AlignedBuffer send, recv;
  Op op;
  std::vector<Work> works;
  std::byte* out = nullptr;  // where this rank's result is (null: none to check)
  std::size_t out_count = 0;
  const std::byte* input = nullptr;  // an out-of-place input to find unchanged (null: none)
  std::size_t input_count = 0;
  std::size_t input_offset = 0;  // first element index of `input`
  bool untouched = false;        // `out` must still hold kUntouchedByte (non-root reduce)
  bool input_is_out = false;     // non-root in-place reduce: the buffer must still be the input
};

// ---- resources --------------------------------------------------------------------------

// Under AddressSanitizer or ThreadSanitizer the allocator is theirs: freed memory waits in a
// quarantine and shadow memory grows with the heap, so VmRSS is not judged there (fds,
// threads and shared memory still are).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

enum Field {
  rss_kb,
  anon_kb,
  shmem_kb,
  heap_kb,
  fds,
  threads,
  shm_maps,
  shm_map_kb,
  shm_files,
  shm_file_kb,
  devshm_all,
  out_hash,
  wrong,
  shapes,
  kFields
};

struct Sample {
  std::uint64_t ops = 0;
  double seconds = 0;
  std::vector<std::array<std::int64_t, kFields>> ranks;  // every rank's fields
};

std::int64_t status_field(const std::string& text, const char* name) {
  const std::size_t at = text.find(std::string("\n") + name + ":");
  if (at == std::string::npos) return -1;
  return std::strtoll(text.c_str() + at + std::strlen(name) + 2, nullptr, 10);
}

std::string read_file(const char* path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return "\n" + ss.str();
}

int count_dir(const char* path) {
  DIR* d = opendir(path);
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) ++n;
  closedir(d);
  return n;
}

// This rank's resources. /dev/shm entries are counted for this job only (names with the
// communicator ids of the segments this rank maps), since other jobs may share the host.
std::array<std::int64_t, kFields> take_sample(std::uint64_t hash, std::int64_t wrong_results,
                                              std::int64_t tuned_shapes) {
  std::array<std::int64_t, kFields> f{};
  // Memory malloc holds free (fragments between live blocks, the top of an arena) goes
  // back to the kernel first, so that VmRSS counts what the process uses, not what the
  // allocator kept after a peak; heap_MiB (in use) is read either way.
  ::malloc_trim(0);
  const std::string status = read_file("/proc/self/status");
  f[rss_kb] = status_field(status, "VmRSS");
  f[anon_kb] = status_field(status, "RssAnon");
  f[shmem_kb] = status_field(status, "RssShmem");
  const struct mallinfo2 mi = mallinfo2();  // bytes malloc has handed out and not had back
  f[heap_kb] = static_cast<std::int64_t>((mi.uordblks + mi.hblkhd) / 1024);
  f[threads] = status_field(status, "Threads");
  f[fds] = count_dir("/proc/self/fd") - 1;  // less opendir's own
  std::set<std::string> inodes, prefixes;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const std::size_t at = line.find("/dev/shm/");
    if (at == std::string::npos) continue;
    unsigned long long lo = 0, hi = 0;
    std::sscanf(line.c_str(), "%llx-%llx", &lo, &hi);
    std::istringstream words(line);
    std::string range, perms, offset, dev, inode;
    words >> range >> perms >> offset >> dev >> inode;
    inodes.insert(dev + ":" + inode);
    f[shm_map_kb] += static_cast<std::int64_t>((hi - lo) / 1024);
    std::string name = line.substr(at + 9);
    name = name.substr(0, name.find(' '));
    // "braid-<comm id hex>-<lo>-<hi>": the job's prefix is up to the second '-'.
    const std::size_t dash = name.find('-', 6);
    if (name.compare(0, 6, "braid-") == 0 && dash != std::string::npos) prefixes.insert(name.substr(0, dash + 1));
  }
  f[shm_maps] = static_cast<std::int64_t>(inodes.size());
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      ++f[devshm_all];
      for (const auto& p : prefixes)
        if (name.compare(0, p.size(), p) == 0) {
          struct stat st {};
          ++f[shm_files];
          if (stat(("/dev/shm/" + name).c_str(), &st) == 0)
            f[shm_file_kb] += static_cast<std::int64_t>(st.st_size / 1024);
        }
    }
    closedir(d);
  }
  std::memcpy(&f[out_hash], &hash, sizeof hash);
  f[wrong] = wrong_results;
  f[shapes] = tuned_shapes;
  return f;
}

// ---- one rank ---------------------------------------------------------------------------

class Rank {
 public:
  Rank(const Settings& s, int rank, const std::string& store_path)
      : s_(s),
        rank_(rank),
        world_(s.ranks),
        schedule_(s, s.ranks),
        ref_stores_(std::make_unique<compression::ErrorFeedbackStore[]>(static_cast<std::size_t>(s.ranks))) {
    CommOptions o;
    o.timeout = std::chrono::seconds(s.op_timeout_s);
    o.name = "soak";
    o.transport = s.transport;
    if (s.hosts > 1) o.host_id = "soak-host-" + std::to_string(rank * s.hosts / s.ranks);
    comm_ = std::make_unique<Communicator>(std::make_shared<FileStore>(store_path), rank, world_, o);
    for (int i = 0; i < s.max_depth; ++i) slots_.push_back(std::make_unique<Slot>(s.max_bytes));
    for (int r = 0; r < world_; ++r) scratch_.push_back(std::make_unique<AlignedBuffer>(s.max_bytes));
    shape_bits_.assign(3 * 4 * kNumReduceOps * 2 * static_cast<std::size_t>(world_) * 256 / 64, 0);
    for (int r = 0; r < world_; ++r) ref_ptrs_.push_back(&ref_stores_[r]);
    // The reference's inputs at their largest now, so that they do not grow the heap later.
    ref_in_.resize(static_cast<std::size_t>(world_));
    for (auto& v : ref_in_) v.reserve(s.max_bytes / sizeof(float));
  }

  // Runs the schedule; returns the exit status.
  int run() {
    if (rank_ == 0) {
      std::printf("braid soak: %" PRIu64 " operations on %d ranks (%d host%s, transport %s), seed %" PRIu64
                  ", sizes up to %zu bytes, async depth 1..%d; a sample every %" PRIu64
                  " operations, baseline at %" PRIu64 "\n",
                  s_.ops, world_, s_.hosts, s_.hosts == 1 ? "" : "s",
                  s_.transport.empty() ? "default" : s_.transport.c_str(), s_.seed, s_.max_bytes, s_.max_depth,
                  s_.sample_every, s_.warmup);
      std::printf("%s\n", comm_->describe_topology().c_str());
      // Sums over the ranks, but rss_max (the largest rank's VmRSS), devshm (every entry of
      // /dev/shm, of any job: for information only) and shapes (the tuned shapes met so far:
      // (collective, element size, op, deterministic, size bucket, root) of the automatic
      // all-reduces, broadcasts and reduces; the library keeps a tuner entry for each).
      std::printf("%9s %7s %6s %8s %7s %8s %8s %8s %4s %7s %8s %7s %9s %6s %6s %5s\n", "ops", "seconds", "ops/s",
                  "rss_MiB", "rss_max", "anon_MiB", "shmemMiB", "heap_MiB", "fds", "threads", "shm_maps", "shm_MiB",
                  "shm_files", "devshm", "shapes", "wrong");
      std::fflush(stdout);
    }
    start_ = Clock::now();
    sample(0);
    std::uint64_t done = 0, next_sample = s_.sample_every;
    bool failed = false;
    while (done < s_.ops && !failed) {
      const int depth =
          static_cast<int>(std::min<std::uint64_t>(static_cast<std::uint64_t>(schedule_.next_depth()), s_.ops - done));
      const Op* current = nullptr;  // the call being posted or waited for
      const char* doing = "posting";
      try {
        for (int i = 0; i < depth; ++i) {
          Slot& slot = *slots_[static_cast<std::size_t>(i)];
          slot.op = schedule_.next(done + static_cast<std::uint64_t>(i));
          current = &slot.op;
          post(slot);
        }
        doing = "waiting for";
        auto t0 = Clock::now();
        for (int i = 0; i < depth; ++i) {
          Slot& slot = *slots_[static_cast<std::size_t>(i)];
          current = &slot.op;
          for (auto& w : slot.works) w.wait();
          if (s_.slow_ms > 0 && rank_ == 0) {
            const auto t1 = Clock::now();
            const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
            if (ms > s_.slow_ms) std::printf("slow: %.1f ms waiting for %s\n", ms, describe(slot.op).c_str());
            t0 = t1;
          }
          if (s_.inject == "wrong" && rank_ + 1 == world_ && slot.out && slot.out_count > 0 && !slot.untouched &&
              slot.op.index >= s_.ops / 2 && !injected_) {
            slot.out[0] ^= std::byte{1};
            injected_ = true;
          }
          check(slot);
          ++kind_counts_[static_cast<int>(slot.op.kind)];
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr,
                     "braid soak: FAILED CALL on rank %d/%d, %s %s (async depth %d, ops #%" PRIu64 "..#%" PRIu64
                     "): %s\n",
                     rank_, world_, doing, current ? describe(*current).c_str() : "?", depth, done,
                     done + static_cast<std::uint64_t>(depth) - 1, e.what());
        ++call_errors_;
        failed = true;
        break;
      }
      done += static_cast<std::uint64_t>(depth);
      if (!s_.inject.empty() && s_.inject != "wrong" && rank_ + 1 == world_ && done >= s_.ops / 2 && !injected_)
        inject_leak();
      if (done >= next_sample || done == s_.ops) {
        if (!sample(done)) failed = true;
        while (next_sample <= done) next_sample += s_.sample_every;
      }
    }
    if (failed) {
      comm_->abort();
      return 1;
    }
    const bool flat = rank_ == 0 ? report() : true;
    return wrong_ == 0 && flat && !hash_mismatch_ ? 0 : 1;
  }

 private:
  template <DataType D>
  using S = typename Elem<D>::Store;

  std::uint64_t base(const Op& o, int r) const {
    return mix64(o.key ^ (0x5851f42d4c957f2dull * static_cast<std::uint64_t>(r + 1)));
  }

  // Elements [first, first + n) of rank r's input to `o`, into dst. Bits and integers are
  // the bytes of the rank's stream of words mix64(base + w·golden); floats take one word
  // per element (make_value). A pure function of (seed, operation, rank, element), so every
  // rank can make every rank's input.
  void gen(const Op& o, int r, std::size_t first, std::size_t n, std::byte* dst) const {
    const std::uint64_t b = base(o, r);
    if (o.values == Values::bits || o.values == Values::integer) {
      const std::size_t es = dtype_size(o.dtype);
      std::size_t at = first * es;
      const std::size_t end = (first + n) * es;
      while (at < end) {
        const std::uint64_t w = mix64(b + (at / 8) * kGolden);
        const std::size_t skip = at % 8, take = std::min<std::size_t>(8 - skip, end - at);
        std::memcpy(dst, reinterpret_cast<const unsigned char*>(&w) + skip, take);
        dst += take;
        at += take;
      }
      return;
    }
    with_dtype(o.dtype, [&](auto d) {
      constexpr DataType D = decltype(d)::value;
      auto* p = reinterpret_cast<S<D>*>(dst);
      for (std::size_t i = 0; i < n; ++i) p[i] = make_value<D>(mix64(b + (first + i) * kGolden), o.values, o.op);
    });
  }

  // Every rank's elements [first, first + n) into scratch_[0..W).
  void gen_all(const Op& o, std::size_t first, std::size_t n) {
    for (int r = 0; r < world_; ++r) gen(o, r, first, n, scratch_[static_cast<std::size_t>(r)]->get());
  }

  // The reference reduction of the ranks' inputs in scratch_, folded in rank order
  // (0, 1, ..., W-1) into scratch_[0].
  template <DataType D>
  const S<D>* fold(const Op& o, std::size_t n) {
    auto* acc = reinterpret_cast<S<D>*>(scratch_[0]->get());
    for (int r = 1; r < world_; ++r) {
      const auto* x = reinterpret_cast<const S<D>*>(scratch_[static_cast<std::size_t>(r)]->get());
      for (std::size_t i = 0; i < n; ++i) acc[i] = combine<D>(o.op, acc[i], x[i]);
    }
    if (o.op == ReduceOp::avg)
      for (std::size_t i = 0; i < n; ++i) acc[i] = divide<D>(acc[i], world_);
    return acc;
  }

  static void guard(std::byte* end) { std::memset(end, kGuardByte, kGuard); }

  // Counts the tuned shapes met (what the library's tuner keys its entries by,
  // core::MeasuredTuner::tune_key): a fixed bitset, so that counting adds no memory.
  void note_shape(const Op& o) {
    collectives::Collective c;
    if (o.kind == Kind::allreduce && o.algorithm == Algorithm::automatic)
      c = collectives::Collective::allreduce;
    else if (o.kind == Kind::broadcast)
      c = collectives::Collective::broadcast;
    else if (o.kind == Kind::reduce)
      c = collectives::Collective::reduce;
    else
      return;
    const std::size_t es = dtype_size(o.dtype);
    const int bucket = collectives::Tuner::size_bucket(collectives::size_bytes(c, o.count, es, world_));
    const bool reduces = c != collectives::Collective::broadcast;
    std::size_t i = static_cast<std::size_t>(c);
    i = i * 4 + (es == 1 ? 0 : es == 2 ? 1 : es == 4 ? 2 : 3);
    i = i * kNumReduceOps + static_cast<std::size_t>(reduces ? o.op : ReduceOp::sum);
    i = i * 2 + (reduces && o.deterministic ? 1 : 0);
    i = i * static_cast<std::size_t>(world_) +
        static_cast<std::size_t>(c == collectives::Collective::allreduce ? 0 : o.root);
    i = i * 256 + static_cast<std::size_t>(std::clamp(bucket, 0, 255));
    const std::uint64_t bit = std::uint64_t{1} << (i % 64);
    if (!(shape_bits_[i / 64] & bit)) {
      shape_bits_[i / 64] |= bit;
      ++shapes_met_;
    }
  }

  // Posts slot.op: makes this rank's input in the slot's buffers and issues the call.
  void post(Slot& slot) {
    const Op& o = slot.op;
    note_shape(o);
    slot.works.clear();
    slot.out = nullptr;
    slot.input = nullptr;
    slot.untouched = slot.input_is_out = false;
    const std::size_t es = dtype_size(o.dtype);
    const std::size_t n = o.count, bytes = n * es;
    const std::size_t W = static_cast<std::size_t>(world_), me = static_cast<std::size_t>(rank_);
    std::byte* sb = slot.send.get();
    std::byte* rb = slot.recv.get();
    auto expect_out = [&](std::byte* out, std::size_t count) {
      slot.out = out;
      slot.out_count = count;
      guard(out + count * es);
    };
    auto keep_input = [&](const std::byte* in, std::size_t count, std::size_t offset) {
      slot.input = in;
      slot.input_count = count;
      slot.input_offset = offset;
    };
    switch (o.kind) {
      case Kind::allreduce:
      case Kind::compressed: {
        std::byte* in = o.in_place ? rb : sb;
        gen(o, rank_, 0, n, in);
        expect_out(rb, n);
        if (!o.in_place) keep_input(sb, n, 0);
        AllreduceOptions a;
        a.algorithm = o.algorithm;
        a.deterministic = o.deterministic;
        a.codec = o.codec;
        a.ef_key = o.ef_key;
        slot.works.push_back(comm_->allreduce(in, rb, n, o.dtype, o.op, a));
        break;
      }
      case Kind::broadcast: {
        BroadcastOptions b;
        b.root = o.root;
        const void* send = nullptr;
        if (rank_ == o.root) {
          std::byte* in = o.in_place ? rb : sb;
          gen(o, rank_, 0, n, in);
          send = in;
          if (!o.in_place) keep_input(sb, n, 0);
        } else if (!o.null_other) {
          send = sb;  // not read on a non-root
        }
        expect_out(rb, n);
        slot.works.push_back(comm_->broadcast(send, rb, n, o.dtype, b));
        break;
      }
      case Kind::reduce: {
        ReduceOptions r;
        r.root = o.root;
        r.deterministic = o.deterministic;
        std::byte* in = o.in_place ? rb : sb;
        gen(o, rank_, 0, n, in);
        void* recv = rb;
        if (rank_ == o.root) {
          expect_out(rb, n);
          if (!o.in_place) keep_input(sb, n, 0);
        } else if (o.in_place) {
          slot.input_is_out = true;  // recv == send is the input; written only on the root
          expect_out(rb, n);
        } else if (o.null_other) {
          recv = nullptr;
          keep_input(sb, n, 0);
        } else {
          std::memset(rb, kUntouchedByte, bytes);
          slot.untouched = true;
          expect_out(rb, n);
          keep_input(sb, n, 0);
        }
        slot.works.push_back(comm_->reduce(in, recv, n, o.dtype, o.op, r));
        break;
      }
      case Kind::allgather: {
        AllgatherOptions g;
        std::byte* in = o.in_place ? rb + me * bytes : sb;
        gen(o, rank_, 0, n, in);
        expect_out(rb, W * n);
        if (!o.in_place) keep_input(sb, n, 0);
        slot.works.push_back(comm_->allgather(in, rb, n, o.dtype, g));
        break;
      }
      case Kind::reduce_scatter: {
        ReduceScatterOptions r;
        r.deterministic = o.deterministic;
        std::byte* in = o.in_place ? rb : sb;
        gen(o, rank_, 0, W * n, in);
        std::byte* out = o.in_place ? rb + me * bytes : rb;
        if (o.in_place) {
          slot.out = out;  // the guard would land in rank me+1's block of the input
          slot.out_count = n;
          if (me + 1 == W) guard(out + bytes);
        } else {
          expect_out(out, n);
          keep_input(sb, W * n, 0);
        }
        slot.works.push_back(comm_->reduce_scatter(in, out, n, o.dtype, o.op, r));
        break;
      }
      case Kind::alltoall: {
        AlltoallOptions a;
        std::byte* in = o.in_place ? rb : sb;
        gen(o, rank_, 0, W * n, in);
        expect_out(rb, W * n);
        if (!o.in_place) keep_input(sb, W * n, 0);
        slot.works.push_back(comm_->alltoall(in, rb, n, o.dtype, a));
        break;
      }
      case Kind::exchange: {
        P2POptions p;
        p.tag = o.tag;
        const int to = (rank_ + o.peer) % world_, from = (rank_ - o.peer + world_) % world_;
        gen(o, rank_, 0, n, sb);
        keep_input(sb, n, 0);
        expect_out(rb, n);
        if (o.recv_first) slot.works.push_back(comm_->recv(rb, n, o.dtype, from, p));
        slot.works.push_back(comm_->send(sb, n, o.dtype, to, p));
        if (!o.recv_first) slot.works.push_back(comm_->recv(rb, n, o.dtype, from, p));
        break;
      }
      case Kind::pair: {
        P2POptions p;
        p.tag = o.tag;
        if (rank_ == o.root) {
          gen(o, rank_, 0, n, sb);
          keep_input(sb, n, 0);
          slot.works.push_back(comm_->send(sb, n, o.dtype, o.peer, p));
        }
        if (rank_ == o.peer) {
          expect_out(rb, n);
          slot.works.push_back(comm_->recv(rb, n, o.dtype, o.root, p));
        }
        break;
      }
      case Kind::barrier: {
        BarrierOptions b;
        slot.works.push_back(comm_->barrier(b));
        break;
      }
    }
  }

  // --inject: a leak the resource checks must catch (kept until the process exits).
  void inject_leak() {
    injected_ = true;
    if (s_.inject == "fd") {
      (void)dup(0);
    } else if (s_.inject == "thread") {
      std::thread([] { pause(); }).detach();
    } else if (s_.inject == "rss") {
      const std::string status = read_file("/proc/self/status");
      leaked_.resize(static_cast<std::size_t>(status_field(status, "VmRSS")) * 1024 * 3 / 100, 1);
    } else if (s_.inject == "shm") {
      const std::string name = "/braid-soak-leak-" + std::to_string(getpid());
      const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd >= 0 && ftruncate(fd, 1 << 20) == 0) mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      shm_unlink(name.c_str());
      if (fd >= 0) close(fd);
    }
  }

  void wrong_result(const Op& o, const std::string& what) {
    ++wrong_;
    if (wrong_ <= static_cast<std::uint64_t>(s_.max_reports))
      std::fprintf(stderr, "braid soak: WRONG RESULT on rank %d/%d: %s: %s\n", rank_, world_, describe(o).c_str(),
                   what.c_str());
  }

  // Compares out[0..n) with want[0..n) (bitwise, or by value: -0 == +0); reports the first
  // difference and how many differ.
  template <DataType D>
  bool compare(const Op& o, const char* where, const std::byte* out, const S<D>* want, std::size_t n, bool bitwise) {
    const auto* p = reinterpret_cast<const S<D>*>(out);
    if (bitwise && (n == 0 || std::memcmp(p, want, n * sizeof(S<D>)) == 0)) return true;
    std::size_t bad = 0, first = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (!same<D>(p[i], want[i], bitwise) && bad++ == 0) first = i;
    if (bad == 0) return true;
    std::ostringstream os;
    os << where << ": " << bad << " of " << n << " elements differ; first at element " << first << ": got "
       << show<D>(p[first]) << ", expected " << show<D>(want[first]);
    wrong_result(o, os.str());
    return false;
  }

  // Compares out[0..n) bit for bit with rank r's input elements [first, first + n).
  template <DataType D>
  bool compare_input(const Op& o, const char* where, const std::byte* out, int r, std::size_t first, std::size_t n) {
    gen(o, r, first, n, scratch_[0]->get());
    return compare<D>(o, where, out, reinterpret_cast<const S<D>*>(scratch_[0]->get()), n, true);
  }

  void fold_hash(const std::byte* p, std::size_t bytes) {
    std::uint64_t h = hash_ ^ bytes;
    std::size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
      std::uint64_t w;
      std::memcpy(&w, p + i, 8);
      h = mix64(h ^ w);
    }
    std::uint64_t tail = 0;
    std::memcpy(&tail, p + i, bytes - i);
    hash_ = mix64(h ^ tail);
  }

  void check(Slot& slot) {
    const Op& o = slot.op;
    const std::size_t es = dtype_size(o.dtype);
    if (slot.out && !(o.kind == Kind::reduce_scatter && o.in_place && rank_ + 1 != world_)) {
      const std::byte* g = slot.out + slot.out_count * es;
      for (std::size_t i = 0; i < kGuard; ++i)
        if (g[i] != static_cast<std::byte>(kGuardByte)) {
          wrong_result(o, "the " + std::to_string(kGuard) + " bytes after the output were overwritten (byte " +
                              std::to_string(i) + " past the end)");
          break;
        }
    }
    with_dtype(o.dtype, [&](auto d) {
      constexpr DataType D = decltype(d)::value;
      if (slot.input)
        compare_input<D>(o, "out-of-place input changed", slot.input, rank_, slot.input_offset, slot.input_count);
    });
    if (!slot.out) return;
    if (slot.untouched) {
      for (std::size_t i = 0; i < slot.out_count * es; ++i)
        if (slot.out[i] != static_cast<std::byte>(kUntouchedByte)) {
          wrong_result(o, "a non-root's recv buffer was written at byte " + std::to_string(i));
          break;
        }
      return;
    }
    if (o.kind == Kind::compressed) return check_compressed(slot);
    const std::size_t n = o.count, W = static_cast<std::size_t>(world_), me = static_cast<std::size_t>(rank_);
    with_dtype(o.dtype, [&](auto d) {
      constexpr DataType D = decltype(d)::value;
      const bool bits = o.values == Values::bits || o.values == Values::integer;
      switch (o.kind) {
        case Kind::allreduce:
          gen_all(o, 0, n);
          if (o.values == Values::tol) return check_tolerance<D>(slot);
          compare<D>(o, "result", slot.out, fold<D>(o, n), n, bits);
          return;
        case Kind::reduce:
          if (slot.input_is_out) {
            compare_input<D>(o, "a non-root's in-place buffer changed", slot.out, rank_, 0, n);
            return;
          }
          gen_all(o, 0, n);
          compare<D>(o, "result", slot.out, fold<D>(o, n), n, bits);
          return;
        case Kind::reduce_scatter:
          gen_all(o, me * n, n);
          compare<D>(o, "result", slot.out, fold<D>(o, n), n, bits);
          return;
        case Kind::broadcast:
          compare_input<D>(o, "result", slot.out, o.root, 0, n);
          return;
        case Kind::allgather:
          for (std::size_t r = 0; r < W; ++r)
            if (!compare_input<D>(o, ("block of rank " + std::to_string(r)).c_str(), slot.out + r * n * es,
                                  static_cast<int>(r), 0, n))
              return;
          return;
        case Kind::alltoall:
          for (std::size_t r = 0; r < W; ++r)
            if (!compare_input<D>(o, ("block from rank " + std::to_string(r)).c_str(), slot.out + r * n * es,
                                  static_cast<int>(r), me * n, n))
              return;
          return;
        case Kind::exchange:
          compare_input<D>(o, "received", slot.out, (rank_ - o.peer + world_) % world_, 0, n);
          return;
        case Kind::pair:
          compare_input<D>(o, "received", slot.out, o.root, 0, n);
          return;
        case Kind::compressed:
        case Kind::barrier:
          return;
      }
    });
  }

  // Random floats summed in any order (the ranks' inputs in scratch_): within 2·W·u·Σ|x|
  // (u the type's unit roundoff) of the exact sum, and the same bits on every rank (hashed,
  // compared at the samples).
  template <DataType D>
  void check_tolerance(Slot& slot) {
    const Op& o = slot.op;
    const auto* p = reinterpret_cast<const S<D>*>(slot.out);
    const double scale = o.op == ReduceOp::avg ? 1.0 / world_ : 1.0;
    std::size_t bad = 0, first = 0;
    double got_first = 0, want_first = 0, tol_first = 0;
    for (std::size_t i = 0; i < o.count; ++i) {
      double exact = 0, mag = 0;
      for (int r = 0; r < world_; ++r) {
        const double x = to_double<D>(reinterpret_cast<const S<D>*>(scratch_[static_cast<std::size_t>(r)]->get())[i]);
        exact += x;
        mag += std::fabs(x);
      }
      exact *= scale;
      const double tol = (2.0 * world_ * Elem<D>::unit * mag + 2 * Elem<D>::unit * std::fabs(exact)) * scale + 1e-30;
      const double got = to_double<D>(p[i]);
      if (!(std::fabs(got - exact) <= tol) && bad++ == 0) {
        first = i;
        got_first = got;
        want_first = exact;
        tol_first = tol;
      }
    }
    fold_hash(slot.out, o.count * sizeof(S<D>));
    if (bad == 0) return;
    std::ostringstream os;
    os.precision(12);
    os << bad << " of " << o.count << " elements outside the tolerance; first at element " << first << ": got "
       << got_first << ", exact " << want_first << ", tolerance " << tol_first;
    wrong_result(o, os.str());
  }

  // Compressed: element by element (-0 == +0) against compression::reference_allreduce
  // run for every rank with this rank's copy of every rank's residuals.
  void check_compressed(Slot& slot) {
    const Op& o = slot.op;
    const std::size_t n = o.count;
    const auto* out = reinterpret_cast<const float*>(slot.out);
    fold_hash(slot.out, n * sizeof(float));
    if (s_.hosts > 1) {  // hierarchical compression: no flat reference; finite and the same on every rank
      for (std::size_t i = 0; i < n; ++i)
        if (!std::isfinite(out[i])) {
          wrong_result(o, "element " + std::to_string(i) + " is not finite");
          return;
        }
      return;
    }
    for (int r = 0; r < world_; ++r) {
      auto& v = ref_in_[static_cast<std::size_t>(r)];
      v.resize(n);
      gen(o, r, 0, n, reinterpret_cast<std::byte*>(v.data()));
    }
    compression::ReferenceStep step;
    step.spec = compression::parse_codec(o.codec);
    step.average = o.op == ReduceOp::avg;
    step.step = o.codec_step;
    step.key = o.ef_key;
    const auto ref = compression::reference_allreduce(step, ref_in_, ref_ptrs_);
    compare<DataType::f32>(o, "result (compression::reference_allreduce)", slot.out,
                           ref[static_cast<std::size_t>(rank_)].data(), n, false);
  }

  // Every rank's resources to rank 0 (one all-gather), which prints a row. False when the
  // ranks' output hashes differ (results that should be identical are not).
  bool sample(std::uint64_t done) {
    const auto mine = take_sample(hash_, static_cast<std::int64_t>(wrong_), static_cast<std::int64_t>(shapes_met_));
    std::vector<std::int64_t> all(static_cast<std::size_t>(world_) * kFields);
    try {
      AllgatherOptions g;
      comm_->allgather(mine.data(), all.data(), kFields, DataType::i64, g).wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "braid soak: rank %d: the sample all-gather after %" PRIu64 " operations failed: %s\n",
                   rank_, done, e.what());
      ++call_errors_;
      return false;
    }
    Sample s;
    s.ops = done;
    s.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    for (int r = 0; r < world_; ++r) {
      std::array<std::int64_t, kFields> f{};
      std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(r) * kFields, kFields, f.begin());
      s.ranks.push_back(f);
      if (f[out_hash] != mine[out_hash] && !hash_mismatch_) {
        hash_mismatch_ = true;
        std::fprintf(stderr,
                     "braid soak: rank %d: results that must be identical on every rank differ: rank %d's hash of "
                     "them differs from rank %d's by operation %" PRIu64 "\n",
                     rank_, r, rank_, done);
      }
    }
    if (rank_ == 0) {
      auto sum = [&](Field k) {
        std::int64_t t = 0;
        for (const auto& f : s.ranks) t += f[k];
        return t;
      };
      std::int64_t rss_max = 0, devshm = 0;
      for (const auto& f : s.ranks) {
        rss_max = std::max(rss_max, f[rss_kb]);
        devshm = std::max(devshm, f[devshm_all]);
      }
      const double dt = samples_.empty() ? 0 : s.seconds - samples_.back().seconds;
      const double rate = samples_.empty() || dt <= 0 ? 0 : static_cast<double>(done - samples_.back().ops) / dt;
      auto mib = [&](Field k) { return static_cast<double>(sum(k)) / 1024; };
      std::printf("%9" PRIu64 " %7.1f %6.0f %8.1f %7.1f %8.1f %8.1f %8.1f %4" PRId64 " %7" PRId64 " %8" PRId64
                  " %7.1f %9" PRId64 " %6" PRId64 " %6" PRId64 " %5" PRId64 "\n",
                  done, s.seconds, rate, mib(rss_kb), static_cast<double>(rss_max) / 1024, mib(anon_kb), mib(shmem_kb),
                  mib(heap_kb), sum(fds), sum(threads), sum(shm_maps), mib(shm_map_kb), sum(shm_files), devshm,
                  mine[shapes], sum(wrong));
      std::fflush(stdout);
    }
    samples_.push_back(std::move(s));
    return !hash_mismatch_;
  }

  // Rank 0, after the last sample: totals, the growth from the baseline, the verdict.
  bool report() {
    const Sample& last = samples_.back();
    std::int64_t wrong_total = 0;
    for (const auto& f : last.ranks) wrong_total += f[wrong];
    std::printf("operations by collective:");
    for (int k = 0; k < kKinds; ++k)
      std::printf(" %s %" PRIu64 "%s", kind_name(static_cast<Kind>(k)), kind_counts_[k], k + 1 < kKinds ? "," : "\n");
    std::printf("%" PRIu64 " operations in %.1f s (%.0f ops/s), %" PRId64 " wrong results on all ranks\n", last.ops,
                last.seconds, last.seconds > 0 ? static_cast<double>(last.ops) / last.seconds : 0.0, wrong_total);
    const Sample* basep = nullptr;
    for (const auto& sm : samples_)
      if (sm.ops >= s_.warmup) {
        basep = &sm;
        break;
      }
    if (!basep || basep == &last) {
      std::printf("resources: too few samples after the warm-up of %" PRIu64 " operations to judge growth\n",
                  s_.warmup);
      return wrong_total == 0;
    }
    const Sample& base = *basep;
    bool flat = true;
    double worst_rss = -1e9;
    int worst_rank = 0;
    std::ostringstream grew;
    for (int r = 0; r < world_; ++r) {
      const auto& a = base.ranks[static_cast<std::size_t>(r)];
      const auto& b = last.ranks[static_cast<std::size_t>(r)];
      const double rss = 100.0 * static_cast<double>(b[rss_kb] - a[rss_kb]) / static_cast<double>(a[rss_kb]);
      if (rss > worst_rss) {
        worst_rss = rss;
        worst_rank = r;
      }
      if (rss > s_.rss_tolerance && !kSanitized)
        grew << " rank " << r << " VmRSS " << a[rss_kb] << " -> " << b[rss_kb] << " kB;";
      for (Field f : {fds, threads, shm_maps, shm_map_kb, shm_files, shm_file_kb}) {
        static const char* names[kFields] = {"VmRSS",       "RssAnon",     "RssShmem",     "heap in use kB",
                                             "fds",         "threads",     "shm mappings", "shm mapped kB",
                                             "shm entries", "shm entry kB"};
        if (b[f] > a[f]) grew << " rank " << r << " " << names[f] << " " << a[f] << " -> " << b[f] << ";";
      }
    }
    const std::string g = grew.str();
    flat = g.empty();
    auto sum = [](const Sample& sm, Field k) {
      std::int64_t t = 0;
      for (const auto& f : sm.ranks) t += f[k];
      return t;
    };
    std::printf("resources from the baseline (%" PRIu64 " ops) to the end (%" PRIu64
                " ops), all ranks: VmRSS %.1f -> %.1f MiB "
                "(largest growth of one rank: %+.2f%%, rank %d; limit %.2f%%), fds %" PRId64 " -> %" PRId64
                ", threads %" PRId64 " -> %" PRId64 ", shm mappings %" PRId64 " -> %" PRId64
                " (%.1f -> %.1f MiB), shm entries %" PRId64 " -> %" PRId64 "\n",
                base.ops, last.ops, static_cast<double>(sum(base, rss_kb)) / 1024,
                static_cast<double>(sum(last, rss_kb)) / 1024, worst_rss, worst_rank, s_.rss_tolerance, sum(base, fds),
                sum(last, fds), sum(base, threads), sum(last, threads), sum(base, shm_maps), sum(last, shm_maps),
                static_cast<double>(sum(base, shm_map_kb)) / 1024, static_cast<double>(sum(last, shm_map_kb)) / 1024,
                sum(base, shm_files), sum(last, shm_files));
    if (kSanitized)
      std::printf("VmRSS not judged: a sanitizer's allocator (quarantine, shadow memory) grows it by design\n");
    if (!flat) std::printf("resources GREW:%s\n", g.c_str());
    const bool ok = flat && wrong_total == 0 && !hash_mismatch_;
    std::printf("soak %s\n", ok ? "PASSED" : "FAILED");
    std::fflush(stdout);
    return ok;
  }

  const Settings& s_;
  const int rank_;
  const int world_;
  Schedule schedule_;
  std::unique_ptr<Communicator> comm_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<std::unique_ptr<AlignedBuffer>> scratch_;            // every rank's input, for the references
  std::unique_ptr<compression::ErrorFeedbackStore[]> ref_stores_;  // every rank's residuals, for the reference
  std::vector<compression::ErrorFeedbackStore*> ref_ptrs_;
  std::vector<std::vector<float>> ref_in_;
  std::vector<Sample> samples_;
  std::uint64_t kind_counts_[kKinds] = {};
  std::uint64_t wrong_ = 0, call_errors_ = 0, hash_ = 0;
  bool hash_mismatch_ = false;
  bool injected_ = false;
  std::vector<std::uint64_t> shape_bits_;  // see note_shape
  std::uint64_t shapes_met_ = 0;
  std::vector<char> leaked_;
  Clock::time_point start_;
};

int run_rank(const Settings& s, int rank, const std::string& store_path) {
  // Blocks of 128 KiB and more are mapped and unmapped by themselves, so that VmRSS follows
  // the memory in use: glibc's default raises this threshold to the largest block freed
  // (up to 32 MiB), and the freed blocks that then stay in the heap swing VmRSS by tens of
  // MiB from sample to sample (the references' and the library's large temporaries).
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  mallopt(M_TRIM_THRESHOLD, 128 * 1024);
  try {
    Rank r(s, rank, store_path);
    return r.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "braid soak: rank %d failed: %s\n", rank, e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Settings s = parse_args(argc, argv);
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/braid-soak-XXXXXX";
  if (!mkdtemp(dir.data())) {
    std::perror("braid soak: mkdtemp");
    return 1;
  }
  const std::string store_path = dir + "/store";
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < s.ranks; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("braid soak: fork");
      for (pid_t p : pids) kill(p, SIGKILL);
      return 1;
    }
    if (pid == 0) {
      const int code = run_rank(s, r, store_path);
      std::fflush(nullptr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  // Wait for every rank; past --timeout, kill the ones still running (a hang is a failure).
  const auto deadline = Clock::now() + std::chrono::seconds(s.timeout_s);
  std::vector<int> status(pids.size(), -1);
  std::size_t left = pids.size();
  bool timed_out = false;
  while (left > 0) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (status[i] != -1) continue;
      int st = 0;
      if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        status[i] = st;
        --left;
      }
    }
    if (left == 0) break;
    if (Clock::now() > deadline && !timed_out) {
      timed_out = true;
      std::fprintf(stderr, "braid soak: still running after %d s: killing the ranks\n", s.timeout_s);
      for (std::size_t i = 0; i < pids.size(); ++i)
        if (status[i] == -1) kill(pids[i], SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::remove(store_path.c_str());
  rmdir(dir.c_str());
  int failed = 0;
  for (std::size_t i = 0; i < status.size(); ++i) {
    const int st = status[i];
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
    ++failed;
    if (WIFSIGNALED(st))
      std::fprintf(stderr, "braid soak: rank %zu was killed by signal %d\n", i, WTERMSIG(st));
    else
      std::fprintf(stderr, "braid soak: rank %zu exited with status %d\n", i, WEXITSTATUS(st));
  }
  if (failed) std::fprintf(stderr, "braid soak: FAILED (%d of %d ranks)\n", failed, s.ranks);
  return failed ? 1 : 0;
}
