// All-to-all by pairwise exchange (Algorithm::ring; Open MPI's "ring" alltoall): rank
// r sends block j of its input to rank j and ends with rank j's block r in block j of
// its output.
//
// In step k = 1 .. n-1 rank r sends block (r+k) mod n to rank (r+k) mod n and receives
// from rank (r-k) mod n, so that every step is a permutation and no rank receives from
// two at once; all steps are posted together and the engine overlaps them. Its own
// block is a local copy (nothing in place).
//
// The same plan must work in place, where a received block overwrites the input block
// still to be sent to that peer. Block (r-k) is sent in step n-k: for k > n/2 that
// send came earlier and the receive lands straight in the output after it; for
// k <= n/2 the block goes to scratch and is copied into place once the send is done.
// (Both partners of a pair cannot wait for their own send first: with rendezvous sends
// that would deadlock.)
//
// Per rank: (n-1)·count elements sent and received in n-1 messages, floor(n/2)·count
// elements of scratch and of local copy. Time ~ (n-1)·α + (n-1)·N·β with N =
// count·elem bytes per peer (latency linear in n; no bytes travel twice).
//
// alltoallv is the same exchange over blocks of their own sizes (sent_blocks() and
// received_blocks(): its row and column of the count matrix); an empty block is no
// message. In place it needs the same layout both ways (the communicator checks), so
// the parking above holds block for block.
#include "collectives/builder.hpp"

namespace braid::collectives {

void build_pairwise_alltoall(Builder& b) {
  const PlanRequest& req = b.req();
  const BlockLayout out = sent_blocks(req), in = received_blocks(req);
  if (out.total == 0 && in.total == 0) return;
  const std::uint64_t n = static_cast<std::uint64_t>(req.world), r = static_cast<std::uint64_t>(req.rank);
  const std::uint32_t ph = b.phase("pairwise exchange"), local = b.phase("local copy");
  b.copy(out.region(Buffer::input, r), in.region(Buffer::output, r), local);
  std::vector<std::uint64_t> park(n, 0);  // scratch offset of the block parked from rank (r - k)
  std::uint64_t parked = 0;
  for (std::uint64_t k = 1; 2 * k <= n; ++k) {
    park[k] = parked;
    parked += in.count[(r + n - k) % n];
  }
  const std::uint64_t base = b.scratch(parked);
  for (std::uint64_t k = 1; k < n; ++k) {
    const std::uint64_t to = (r + k) % n, from = (r + n - k) % n;
    b.send(static_cast<int>(to), out.region(Buffer::input, to), ph);
    if (2 * k <= n) b.recv(static_cast<int>(from), {Buffer::scratch, base + park[k], in.count[from]}, ph);
    else b.recv(static_cast<int>(from), in.region(Buffer::output, from), ph);
  }
  for (std::uint64_t k = 1; 2 * k <= n; ++k) {
    const std::uint64_t from = (r + n - k) % n;
    b.copy({Buffer::scratch, base + park[k], in.count[from]}, in.region(Buffer::output, from), local);
  }
}

}  // namespace braid::collectives
