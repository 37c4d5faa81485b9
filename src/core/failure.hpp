// Failure records: what the ranks of a communicator tell each other about a failure
// through the store, and what a rank concludes when the store cannot tell it.
//
// Records (in the communicator's namespace of the store):
//   abort/<r>    "<blamed rank>\n<reason>"  rank r failed; written before it closes its connections
//   blamed/<p>   <reason>                   a rank found p dead (for ranks still connecting to p)
//   stall/<r>    "<seq>\n<rank waited on>"  rank r's deadline fired in call <seq> while it waited
//   left/<r>     <sentence>                 rank r closed its communicator cleanly
//   store_host   <r>                        rank r's process serves the store (TcpStore server)
//
// The store helps to name the right rank; it must never delay the report or change who
// is blamed when it cannot answer (DESIGN.md §8). So every call made on the failure path
// runs on a thread of its own and is waited for a short budget at most: a store whose host
// is stopped, dead or cut off costs the budget once (the first call that finds it silent),
// after which every call answers at once with the store's silence until the stuck call
// returns. The engine then decides from what it saw itself (the peer it waited on, the
// connection that closed) and, where the store is served by a rank, from that rank's
// silence: a store that stops answering while its host's rank takes part in the call is
// that rank's failure, not the store's alone.
#pragma once

#include <braid/store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace braid::core {

/// Whether this process serves `store`: it is a TcpStore whose server listens in this
/// process (rank 0 of a job launched from the environment, or a program's own
/// TcpStore(..., is_server = true)). Reads /proc; false when it cannot tell.
bool serves_store(const Store& store) noexcept;

/// What the store says of a peer whose connection closed.
struct PeerRecord {
  enum class Kind {
    failed,   ///< it failed on its own: `blame` is whom it blamed, `text` its reason
    left,     ///< it closed its communicator cleanly: `text` says so
    none,     ///< the store answered and has nothing: the peer died
    unknown,  ///< the store did not answer (in time): `text` says why
  };
  Kind kind = Kind::unknown;
  int blame = -1;
  std::string text;
};

/// What following the ranks' stall records found (FailureBoard::follow_stalls).
struct StallVerdict {
  int blame = -1;             ///< the silent rank, or -1 (the local blame stands)
  bool no_record = false;     ///< `blame` is silent only in the store: it left no record at all
  std::string text;           ///< the sentence for the error, or ""
  std::string store_silence;  ///< why the store could not be read ("" when it answered)
};

/// The failure records of one communicator (one per engine). Every member is safe to
/// call from any thread and returns within its budget whatever the store does; none throws.
class FailureBoard {
 public:
  /// `store`: the communicator's (prefixed) store; `budget`: how long the failure path
  /// waits for one store call (a healthy store answers in well under a millisecond).
  FailureBoard(std::shared_ptr<Store> store, int rank, std::chrono::milliseconds budget);
  ~FailureBoard();
  FailureBoard(const FailureBoard&) = delete;
  FailureBoard& operator=(const FailureBoard&) = delete;

  /// Records that this rank's process serves the store ("store_host"). Synchronous: call
  /// while setting up, where the store is needed anyway.
  void claim_store_host();
  /// Reads "store_host" in the background (fire and forget; a no-op once known or while a
  /// read is under way). Call while the store is healthy: after routing, after the first call.
  void learn_store_host() noexcept;
  /// The rank whose process serves the store, -1 when none or not known.
  int store_host() const noexcept;

  /// Leaves this rank's failure (abort/<rank>, and blamed/<blame>) for its neighbours, who
  /// read it when they see its connections close: waits up to the budget for the store.
  void publish_failure(int blame, const std::string& reason) noexcept;
  /// Leaves left/<rank> (a clean close), waiting 200 ms at most.
  void publish_leaving(const std::string& sentence) noexcept;
  /// What `peer` left (abort/, then left/), waiting up to the budget.
  PeerRecord record_of(int peer) noexcept;
  /// For transports that wait for a peer's record (PeerDirectory::peer_gone): abort/,
  /// blamed/ or left/ of `peer`; empty when there is none or the store does not answer.
  std::optional<std::string> peer_gone(int peer) noexcept;
  /// After a deadline in call `seq` while waiting on `first`: publishes stall/<rank> and
  /// follows the records of the ranks waited on until `grace` has passed, to the first rank
  /// with none (a silent peer). Returns within grace + 200 ms.
  StallVerdict follow_stalls(std::uint64_t seq, int first, std::chrono::milliseconds grace) noexcept;

  /// "" while the store answers; else a sentence saying it does not ("the store, served by
  /// rank 0's process, has not answered within 1000 ms", "the store failed: ...").
  std::string store_silence() const;

 private:
  struct Shared;
  std::shared_ptr<Shared> s_;
};

}  // namespace braid::core
