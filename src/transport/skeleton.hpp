// The skeleton the socket-set-up transports share (tcp, shm): a listening socket in the
// poller; accepted sockets waiting for their hello (bounded in number and time); the
// authentication of a hello (communicator, per-job token, ranks); one timerfd for every
// set-up deadline; the connection table; and the progress() and close_all() loops that
// tie them together. A transport derives from Skeleton, frames its own hello (its
// wire.hpp) and supplies the parts that differ: what an authenticated hello sets up, how
// connections move bytes, and which set-up deadlines its connections have.
//
// Everything runs on the communicator's progress thread, like every transport.
#pragma once

#include "base/auth.hpp"
#include "base/fd.hpp"
#include "transport/common.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <algorithm>
#include <string>
#include <vector>

namespace braid::transport {

using Clock = std::chrono::steady_clock;

/// How a transport's hello is framed (its wire.hpp): `fixed_bytes` that start with the
/// 4-byte little-endian `magic`, then a tail whose length `tail_bytes` reads from the fixed
/// part; it returns -1 when the fixed part is not a hello of this version (wrong version,
/// an oversized token), which is refused like a stranger.
struct HelloFormat {
  std::uint32_t magic = 0;
  std::size_t fixed_bytes = 0;
  long (*tail_bytes)(const unsigned char* fixed) = nullptr;
};

/// What a hello claims, as the skeleton authenticates it.
struct HelloClaim {
  std::uint64_t comm_id = 0;
  std::int64_t from_rank = -1;
  std::int64_t to_rank = -1;
  const unsigned char* proof = nullptr;  ///< where the token would be: a proof of it (base/auth.hpp)
  std::size_t proof_bytes = 0;
  const unsigned char* fixed = nullptr;  ///< the hello's fixed part, which the proof is bound to
  std::size_t fixed_bytes = 0;
};

/// What a hello carries after its fixed part `fixed` (whose token length says
/// base::auth::kProofBytes): a fresh proof that the sender knows `token`, bound to `fixed`,
/// so that the token never travels and the claims cannot be changed.
inline std::string hello_proof(const std::string& token, const std::string& fixed) {
  return base::auth::prove(token, fixed);
}

/// How many bytes in all the hello whose first `got` bytes are `buf` needs (the caller
/// reads no further than that, so it is complete when this equals `got`), or -1 when
/// those bytes are not a hello of `format` (wrong magic, or a fixed part its tail_bytes
/// refuses). The magic is judged at 4 bytes, so that a stranger is refused early. Pure:
/// the skeleton's hello reader asks it after every read, and the fuzz targets
/// (tests/fuzz) feed it bytes.
long hello_needs(const HelloFormat& format, const unsigned char* buf, std::size_t got);

/// An authentic hello claim for a rank `rank` of communicator `comm_id` whose per-job
/// token is `token`: this communicator, addressed to `rank`, from a lower rank (the lower
/// rank of a pair connects), with a valid proof of the token bound to its fixed part
/// (checked in constant time). Replays are the listener's to refuse (Skeleton::authentic).
bool hello_authentic(const HelloClaim& claim, std::uint64_t comm_id, int rank, const std::string& token);

/// An accepted socket whose hello is being read.
struct PendingAccept {
  base::UniqueFd fd;
  bool readable = true;
  Clock::time_point deadline{};
  std::vector<unsigned char> buf;  ///< the fixed part, then the tail
  std::size_t got = 0;
  base::UniqueFd passed;    ///< a descriptor that came with the hello (SCM_RIGHTS)
};

/// The connections of one transport instance: looked up by rank, iterated in the order
/// they were made (so progress is fair and deterministic).
template <class Conn>
class ConnectionTable {
 public:
  explicit ConnectionTable(int size) : by_rank_(static_cast<std::size_t>(size)) {}
  Conn* find(int peer) const noexcept { return by_rank_[static_cast<std::size_t>(peer)].get(); }
  /// The connection to `peer`; `make()` creates it on first use and `fresh` says so.
  template <class Make>
  Conn& get(int peer, Make&& make, bool* fresh = nullptr) {
    auto& slot = by_rank_[static_cast<std::size_t>(peer)];
    if (fresh != nullptr) *fresh = !slot;
    if (!slot) {
      slot = make();
      order_.push_back(slot.get());
    }
    return *slot;
  }
  const std::vector<Conn*>& all() const noexcept { return order_; }
  /// Runs `step` on every connection (ones made meanwhile included); true if any moved.
  template <class Step>
  bool step_all(Step&& step) {
    bool moved = false;
    for (std::size_t i = 0; i < order_.size(); ++i) moved |= step(*order_[i]);
    return moved;
  }

 private:
  std::vector<std::unique_ptr<Conn>> by_rank_;
  std::vector<Conn*> order_;
};

/// Why a connection failed; every request posted afterwards fails with the same words.
struct Failure {
  bool failed = false;
  std::string error;
  bool closed = false;  ///< the peer closed or reset (as opposed to bad data or a deadline)
  int blame = -1;       ///< rank blamed, -1 for none (close_all)
  /// The notice the peer sent before closing (Transport::tell_peers), if any: a failure
  /// that is the peer's close then carries its words and its blame.
  bool told = false;
  int told_from = -1, told_blame = -1;
  std::string told_reason;

  /// Records a peer's notice (the first one counts).
  void note(int from, int blamed, const std::string& reason) {
    if (told || failed) return;
    told = true;
    told_from = from;
    told_blame = blamed;
    // "braid Timeout: allreduce #7 ..." -> "allreduce #7 ...": the error around it says braid.
    const auto colon = reason.find(": ");
    told_reason = reason.rfind("braid ", 0) == 0 && colon != std::string::npos ? reason.substr(colon + 2) : reason;
  }
  /// Records the first failure; false when the connection had already failed. A close
  /// after the peer's notice says what the peer said.
  bool set(const std::string& msg, bool peer_closed, int blamed) {
    if (failed) return false;
    failed = true;
    error = msg;
    closed = peer_closed;
    blame = blamed;
    if (told && peer_closed) {
      error += told_words();
      blame = told_blamed_or(blamed);
    } else {
      told = false;
    }
    return true;
  }
  void apply(Request* req) const { fail_request(req, error, blame, closed, told); }
  int told_blamed_or(int fallback) const { return told_blame >= 0 ? told_blame : fallback; }
  /// "; rank P said before closing: <its reason>", or "" without a notice.
  std::string told_words() const {
    return told ? "; rank " + std::to_string(told_from) + " said before closing: " + told_reason : std::string();
  }
  /// Connection::broken(): whether it failed, and why into *why (when given).
  bool report(std::string* why) const {
    if (failed && why != nullptr) *why = error;
    return failed;
  }
  /// Fails every request of a queue of operations (each with a `req`) and empties it.
  template <class Queue>
  void apply_all(Queue& q) const {
    for (std::size_t i = 0; i < q.size(); ++i) apply(q[i].req);
    q.clear();
  }
};

/// Finding a peer's published address without blocking the progress thread (the engine
/// must keep honouring deadlines and abort()): looked at without waiting, again after a
/// backoff of 1 ms doubling to 50 ms, until the connect timeout.
struct PeerLookup {
  Clock::time_point deadline{};
  Clock::time_point retry_at{};
  std::chrono::milliseconds backoff{1};
  /// Schedules the next look at `now` + backoff and doubles the backoff.
  void later(Clock::time_point now) {
    retry_at = now + backoff;
    backoff = std::min(backoff * 2, std::chrono::milliseconds(50));
  }
  /// One look at what `peer` published under `key`. Returns the value; or nothing with
  /// `*error` empty (not yet: retry_at is the next look) or set (the directory failed, or
  /// nothing came within `timeout` of the deadline's start; `what` names the value, e.g.
  /// "its TCP address", and `hint` ends the timeout's message).
  std::optional<std::string> look(PeerDirectory& directory, int peer, const char* key, const char* what,
                                  const char* hint, std::chrono::milliseconds timeout, std::string* error);
};

class Skeleton : public Transport {
 public:
  ~Skeleton() override;
  Skeleton(const Skeleton&) = delete;
  Skeleton& operator=(const Skeleton&) = delete;

  /// Set-up deadlines, then accepts and hellos, then every connection; the timer is armed
  /// for the next deadline before it returns, so the caller may sleep right after.
  bool progress() final;
  /// Fails every connection with `reason` (later requests too) and closes every fd. Idempotent.
  void close_all(const std::string& reason) final;

 protected:
  Skeleton(const CommonOptions& common, Poller& poller, PeerDirectory& directory, const char* name,
           HelloFormat hello);

  /// Starts serving `listen_fd` (bound, listening, non-blocking): watches it and makes the
  /// deadline timer. Throws Error(System) when the timer cannot be made.
  void serve(base::UniqueFd listen_fd);

  // --- What a transport supplies -------------------------------------------------------
  /// A complete hello arrived on `pa` (its buf holds the fixed part and the tail). Return
  /// true when the transport took the socket (moved `pa.fd` out) or failed the claimed
  /// peer's connection itself; false to have it refused (closed and reported).
  virtual bool adopt(PendingAccept& pa) = 0;
  /// An accepted socket, before its hello is read (tcp sets its keepalive here).
  virtual void on_accept(int /*fd*/) {}
  /// The on_refused text for a refused socket: `valid` = a well-formed hello of this
  /// version that names another communicator, rank or token.
  virtual std::string refusal(const PendingAccept& pa, bool valid) const = 0;
  /// Moves every connection (set-up steps, reads, writes); true when anything moved.
  virtual bool progress_connections() = 0;
  /// Serves the connections' set-up retries and deadlines due at `now`; returns the
  /// earliest one still ahead (Clock::time_point::max() for none).
  virtual Clock::time_point connection_deadlines(Clock::time_point now) = 0;
  /// close_all: fails every connection with `reason` and closes their fds.
  virtual void fail_connections(const std::string& reason) = 0;
  /// close_all, after every fd is closed (shm removes leftover segment names here).
  virtual void after_close() noexcept {}

  // --- What the skeleton offers --------------------------------------------------------
  /// An authentic hello: this communicator and token, addressed to this rank, from a lower
  /// rank (the lower rank of a pair connects). The token is compared in constant time.
  bool authentic(const HelloClaim& claim);
  /// One look at what `peer` published under `key` (PeerLookup). `first`: the connection
  /// has just been wanted, so the lookup's deadline starts now. Returns the value; or
  /// nothing with `*error` empty (not yet: a retry is scheduled) or set (the directory
  /// failed, or the peer published nothing within the connect timeout; `what` names the
  /// value, e.g. "its TCP address", and `hint` ends the timeout's message).
  std::optional<std::string> look_up(PeerLookup& lookup, bool first, int peer, const char* key, const char* what,
                                     const char* hint, std::string* error);
  /// Throws InvalidUsage unless `peer` is another rank of this world.
  void check_peer(int peer) const;
  /// A set-up deadline or retry was added: progress() re-arms the timer before it returns.
  void deadlines_changed() noexcept { deadlines_dirty_ = true; }
  /// A request failed outside the byte-moving paths: progress() reports that it moved.
  void changed() noexcept { changed_ = true; }
  bool closed() const noexcept { return closed_; }
  /// Set-up work is waiting for progress() (an accept, a hello's bytes, a deadline): a
  /// transport's prepare_sleep() must not let the engine block.
  bool setup_waiting() const noexcept;
  const std::string& closed_reason() const noexcept { return closed_reason_; }
  /// "tcp transport (rank 3)" for messages.
  std::string self() const;

  const CommonOptions common_;
  Poller& poller_;
  PeerDirectory& directory_;

 private:
  /// Closes the listener, the timer and the sockets still in their hello. Idempotent.
  void shutdown_skeleton() noexcept;
  void accept_all();
  /// 1: complete, 0: needs more bytes, -1: not a valid hello.
  int read_hello(PendingAccept& pa);
  bool service_hellos();
  void drop_pending(std::size_t i) noexcept;
  void service_deadlines();
  void arm_timer(Clock::time_point when);

  const char* name_;
  HelloFormat hello_;
  base::UniqueFd listen_fd_;
  base::UniqueFd timer_fd_;
  std::vector<std::unique_ptr<PendingAccept>> pending_;
  bool listen_ready_ = false;
  bool timer_fired_ = false;
  bool deadlines_dirty_ = false;
  Clock::time_point timer_armed_for_ = Clock::time_point::max();
  bool changed_ = false;
  bool closed_ = false;
  base::auth::ReplayGuard replays_;  ///< nonces of the hellos this listener accepted
  std::string closed_reason_;
};

/// Reads into buf[*got, need) without blocking, collecting a descriptor passed with the
/// bytes (SCM_RIGHTS) into `*passed` when it is not null and empty (others are closed).
/// 1: complete, 0: would block, -1: EOF, -2: error (errno in *err).
int read_with_fd(int fd, unsigned char* buf, std::size_t* got, std::size_t need, base::UniqueFd* passed, int* err);

}  // namespace braid::transport
