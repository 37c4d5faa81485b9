// braid's flight recorder: what each communicator did last, for the post-mortem.
//
// Always on, bounded: the engine keeps the last BRAID_TRACE_ENTRIES operations of its
// communicator (collectives, sends and receives, host tasks) in a ring it overwrites,
// each with its call, size, type, algorithm, codec and times. What is running or queued
// when a dump is asked for is added live, with, per peer, the messages and bytes done
// and to do and the step the rank is on. A dump is one JSON document per rank and
// communicator (docs/observability.md gives its fields); `braid_trace` merges the ranks'
// dumps and says who is behind, who waits on whom, and which ranks issued different
// calls.
//
// Dumps are written by the thread that drives the engine (it alone may read the running
// operations): on a failure or timeout (into BRAID_TRACE_DIR when set), on SIGUSR1
// (BRAID_TRACE_DIR set and the signal not taken by the program), or on
// Communicator::dump_trace(). Recording a finished operation costs a few stores into
// its ring slot and a string move (docs/observability.md, "Cost").
#pragma once

#include "compression/codec.hpp"

#include <braid/types.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace braid::core {

/// One peer's share of an operation that had not finished when it was recorded.
struct PeerProgress {
  int rank = -1;
  std::uint32_t sends = 0, sends_posted = 0, sends_done = 0;
  std::uint32_t recvs = 0, recvs_posted = 0, recvs_done = 0;
  std::uint64_t bytes_to_send = 0, bytes_sent = 0;
  std::uint64_t bytes_to_recv = 0, bytes_received = 0;
  /// Plan step of the first send and receive not done yet (-1: all done).
  std::int64_t next_send_step = -1, next_recv_step = -1;
};

/// One operation as a dump shows it.
struct TraceRecord {
  enum class State : std::uint8_t { done, failed, running, queued, not_run };
  State state = State::done;
  std::uint64_t seq = 0;      ///< collective sequence number (every rank counts alike); 0 for p2p
  std::uint64_t p2p_seq = 0;  ///< sends and receives: their own count
  bool task = false;          ///< a host task or a device call's gate: no plan of its own
  const char* algorithm = "";  ///< the plan's name (static strings)
  /// The operation's name in errors ("allreduce #5 (ring, ...) on rank 1/4"); the call
  /// ("allreduce", "send", ...) is what comes before " #" or " (" ("broadcast (tuner trial) #9").
  std::string name;
  std::uint64_t count = 0;
  DataType dtype = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  int root = -1;  ///< broadcast and reduce: the root; send/recv: the peer
  compression::CodecSpec codec;
  std::uint64_t bytes_sent = 0;  ///< done: what this rank sent for it, to all peers (unfinished: per peer)
  std::chrono::steady_clock::time_point started{}, ended{};  ///< {} when unknown
  /// Not finished when recorded (failed, running): the plan's progress.
  std::uint32_t steps = 0, steps_done = 0;
  std::vector<PeerProgress> peers;
  std::string error;  ///< failed: why
};

/// A finished operation as the ring keeps it: two cache lines, no pointer to free, so
/// that recording writes one sequential stream of memory and overwriting frees nothing.
/// The name is not kept, only the call's words ("allreduce", "broadcast (tuner trial)");
/// dumps rebuild the rest from the fields. A ring of std::string names cost 50-100 ns per
/// 4 KiB all-reduce in cache misses, one of 200-byte entries with the whole name about 20
/// (docs/observability.md, "Cost").
struct alignas(64) TraceEntry {
  static constexpr std::size_t kCallBytes = 48;
  std::uint64_t seq = 0, p2p_seq = 0, count = 0;
  std::uint64_t bytes_sent = 0;  ///< what this rank sent for it, to all peers
  std::chrono::steady_clock::time_point started{}, ended{};
  const char* algorithm = "";
  /// compression::CodecSpec in 16 bytes.
  struct Codec {
    compression::CodecKind kind = compression::CodecKind::none;
    compression::Rounding rounding = compression::Rounding::nearest;
    std::uint16_t block = 0;
    float topk_ratio = 0;
    std::uint64_t seed = 0;
    Codec& operator=(const compression::CodecSpec& c) noexcept;
    compression::CodecSpec spec() const noexcept;
  } codec;
  std::int32_t root = -1;
  DataType dtype = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  bool task = false;
  char call[kCallBytes] = {};  ///< the name's words before " #", cut with "..." when longer
  /// Keeps the call's words of an operation's name ("allreduce #5 (...)" -> "allreduce").
  void set_call(const std::string& name) noexcept;
  /// The name as dumps give it: "allreduce #5 (ring, 1024 x f32, sum)",
  /// "send #3 (64 x f64) to rank 1", "tuner: verdict #9".
  std::string name() const;
};
static_assert(sizeof(TraceEntry) == 128, "a ring entry is two cache lines");

/// The ring of finished operations, and the operations a failure ended (failed, or never
/// started), kept in full. Not thread-safe: the engine's driving thread owns it.
class FlightRecorder {
 public:
  /// Keeps the last `capacity` operations (0: records nothing).
  explicit FlightRecorder(std::size_t capacity) : ring_(capacity) {}
  std::size_t capacity() const noexcept { return ring_.size(); }
  /// Operations recorded since the start (the ring holds the last capacity() of them).
  std::uint64_t recorded() const noexcept { return recorded_; }
  /// The slot the next finished operation goes into (the oldest one's, overwritten);
  /// null when the capacity is 0. Every field must be set by the caller.
  TraceEntry* next() noexcept {
    if (ring_.empty()) return nullptr;
    TraceEntry* e = &ring_[slot_];
    if (++slot_ == ring_.size()) slot_ = 0;  // no division on the hot path
    ++recorded_;
    return e;
  }
  /// Keeps an operation a failure ended (the first kKeptEnded; later ones are counted).
  /// Nothing when the capacity is 0.
  void keep_ended(TraceRecord r);
  static constexpr std::size_t kKeptEnded = 128;
  std::size_t ended_not_kept() const noexcept { return ended_not_kept_; }
  /// Calls f on the ring's operations, oldest first, then on the ended ones.
  void for_each(const std::function<void(const TraceRecord&)>& f) const;

 private:
  std::vector<TraceEntry> ring_;
  std::size_t slot_ = 0;  ///< where next() writes: recorded_ modulo the capacity
  std::uint64_t recorded_ = 0;
  std::vector<TraceRecord> ended_;
  std::size_t ended_not_kept_ = 0;
};

/// Who dumps, and why: the header of a dump.
struct TraceHeader {
  int rank = 0;
  int size = 1;
  std::string comm;
  std::uint64_t comm_id = 0;
  std::string reason;        ///< "timeout", "SIGUSR1", "dump_trace()", the failure's message
  std::string engine_error;  ///< the communicator's failure, "" while healthy
  std::size_t queued_more = 0;  ///< queued operations left out of the dump
  std::string links = "[]";  ///< the engine's links, a JSON array (Engine::links_json)
};

/// The dump as JSON: the header, then the ring's operations (oldest first), then `live`
/// (running, then queued, in issue order).
std::string trace_json(const TraceHeader& h, const FlightRecorder& recorder, const std::vector<TraceRecord>& live);

/// Writes `json` to `dir`/braid_trace.<comm>.<comm_id>.rank<R>.json atomically (a
/// temporary file renamed), making `dir` if needed; returns the path. Throws
/// braid::Error(System) naming the path on failure.
std::string write_trace(const std::string& dir, const TraceHeader& h, const std::string& json);

/// SIGUSR1 listeners: the engines of communicators with BRAID_TRACE_DIR set. The first
/// listener installs a SIGUSR1 handler, unless the program has one (then nothing is
/// installed, said once at INFO); on the signal a watcher thread calls every listener.
/// Returns a handle for remove_dump_listener. Thread-safe.
int add_dump_listener(std::function<void()> on_signal);
/// After it returns the listener is never called again.
void remove_dump_listener(int handle) noexcept;

}  // namespace braid::core
