// Who is still alive: the survivors of a failed communicator agree on its members before
// they shrink it (Communicator::shrink, docs/reliability.md "Shrink").
//
// The store decides, not a rank: ranks that may themselves be dead cannot be the ones
// trusted to decide, so the one object every survivor can reach and that outlives any
// rank (the launcher's store, torchrun's agent's, a FileStore) orders the decision with
// one compare_set. It is the agreement of ULFM's MPI_Comm_agree without its
// rounds: the store is the single linearisation point that ULFM's algorithm builds out of
// the ranks themselves, and braid already depends on it for set-up.
//
// Records, under "shrink/<k>/" of the communicator's namespace (k counts the shrinks):
//   exclude/<r>   "3,5"      the ranks rank r was asked to leave out (written first)
//   alive/<r>     "1"        rank r has called shrink k
//   members       "0,1,3"    the decision: the first proposal written wins
// A rank proposes once every rank has either called shrink, been excluded by a caller, or
// been blamed by a failure record ("blamed/<p>", FailureBoard; not a rank that revoked, whose
// "revoked/<p>" says it is alive), or been found gone by the
// caller's own probe (a process of this host that no longer exists), or once the timeout
// has passed: its proposal is the ranks that have called, less the excluded. Every caller
// reads the one decision, so all get the same members; a rank that calls after the
// decision left it out learns that and leaves. A member that dies after the decision is
// a failure of the new communicator, found there and shrunk again.
#pragma once

#include <braid/store.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace braid::core {

/// Agrees with the other callers of shrink `k` on the ranks (of `size`, in `store`, the
/// communicator's namespace) that go on, in increasing order. Returns them; throws
/// Error(Aborted) when the decision leaves `rank` out, TimeoutError/Network from the store,
/// Unsupported when the store has no compare_set. Bounded by `timeout` plus the store's
/// own deadlines.
/// `gone(r)`: whether this rank knows by itself that rank r is dead (may be null); it only
/// makes the decision come sooner, every caller still gets the one decision.
std::vector<int> agree_on_members(Store& store, std::uint64_t k, int rank, int size, const std::vector<int>& exclude,
                                  std::chrono::milliseconds timeout, const std::function<bool(int)>& gone = {});

/// This process, as another process can check that it still exists: "<host id>\n<boot
/// id>\n<pid namespace>\n<pid>". Published by every rank at creation ("proc/<rank>").
std::string process_identity(const std::string& host_id);
/// Whether the process `identity` (process_identity) names is on this host (the same host
/// id and kernel boot), in this pid namespace, and gone (no such process, or a zombie). False whenever it cannot tell.
bool process_gone(const std::string& identity, const std::string& host_id);

/// The record a rank leaves when it revokes its communicator (Communicator::revoke): it is
/// alive, whatever its peers blame it for.
inline std::string revoked_key(int rank) { return "revoked/" + std::to_string(rank); }

/// "0,1,3" <-> {0, 1, 3}; parse fails (false) on anything else, or a rank outside [0, size).
std::string format_ranks(const std::vector<int>& ranks);
bool parse_ranks(const std::string& text, int size, std::vector<int>* out);

}  // namespace braid::core
