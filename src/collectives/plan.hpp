// braid plans: algorithms as data (DESIGN.md §4).
//
// An algorithm is a pure function from a PlanRequest to the Plan of one rank: the
// ordered steps that rank performs (send a region to a peer, receive into a region,
// receive-and-reduce, copy, local reduce) on element ranges of its input, output and
// scratch buffers. The engine executes any plan; the verifier runs every rank's plan
// symbolically in one process. Plans name peers by rank and never see transports.
// Builders live in one file per algorithm (builder.hpp lists them); docs/algorithms.md
// describes each.
//
// Execution rules shared by the engine and the verifier:
// - A step may start once every step in its dependency list has completed.
// - Sends to one peer are posted in plan order; so are receives from one peer; and
//   the n-th send from A to B matches the n-th receive B posts for A. A step whose
//   dependencies are not met therefore also holds back later steps of its queue.
// - Local steps (copy, reduce) run in plan order as well.
// - Plans are correct whether a send completes when its data is buffered (eager) or
//   only once the matching receive is posted (rendezvous): the verifier runs both.
// - recv_reduce: dst = src (op) message, src read when the message is in. src and dst
//   are either the same elements (in place: the engine stages the message, in one of
//   its few staging buffers) or disjoint. All operations are commutative, so the
//   engine may land the message in dst first when dst does not overlap src.
// - reduce: dst = src (op) src2; dst may be an operand, never overlap one partially.
// - No plan writes its input buffer, and no step addresses an empty region.
// - `finalize` on a step that writes dst applies the op's finishing touch to dst once
//   the step is done (avg: divide by the world size). Each output element must be
//   finalized exactly once for avg, never for other ops.
// - premul_sum plans are the sum plan with each rank's input scaled by the call's factor
//   where it is first read (the factor is the call's, not the plan's, so one cached plan
//   serves every factor; prescale() in plan.cpp): a recv_reduce or reduce of the input
//   scales it inside the reduction (Step::scale_src); any other read of the input (a
//   send, a copy) reads a copy that a `scale` step, placed just before it, wrote into
//   scratch.
// - Compressed plans (PlanRequest::codec set; collectives/compressed.cpp) also encode
//   f32 values into the `packed` buffer and decode them back (encode, decode,
//   decode_add), and send and receive packed regions. Packed regions count encoded
//   values and start at a multiple of Plan::packed_frame; their bytes are
//   compression/framed.hpp's layout. An encode may carry error feedback: src2 is then
//   a region of a residual buffer (feedback_worker, feedback_owner) of src's size, read
//   and rewritten by the step. Residuals persist across calls (the communicator's
//   error-feedback store); every other buffer is the call's.
#pragma once

#include "compression/codec.hpp"

#include <braid/types.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace braid::collectives {

/// Which collective a plan implements.
enum class Collective : std::uint8_t {
  allreduce = 0,
  broadcast,
  reduce,
  allgather,
  reduce_scatter,
  alltoall,
  gather,
  scatter,
  allgatherv,        ///< all-gather of per-rank block sizes (PlanRequest::counts)
  reduce_scatter_v,  ///< reduce-scatter into per-rank block sizes (PlanRequest::counts)
  alltoallv,         ///< all-to-all of per-pair block sizes (PlanRequest::counts, a matrix)
};

/// True for the collectives whose blocks have sizes of their own (PlanRequest::counts).
constexpr bool is_v(Collective c) noexcept {
  return c == Collective::allgatherv || c == Collective::reduce_scatter_v || c == Collective::alltoallv;
}

/// Name of a collective ("allreduce", ...).
const char* to_string(Collective c) noexcept;

/// The buffers a plan addresses. In-place calls alias input and output.
enum class Buffer : std::uint8_t {
  input = 0,
  output,
  scratch,
  packed,           ///< encoded payloads (compressed plans; counted in encoded values)
  feedback_worker,  ///< error-feedback residual of a worker's encodes (persistent, f32)
  feedback_owner,   ///< error-feedback residual of a shard owner's encodes (persistent, f32)
};

/// Number of Buffer values.
inline constexpr int kNumBuffers = 6;

/// A contiguous range of elements of one buffer.
struct Region {
  Buffer buf = Buffer::input;
  std::uint64_t offset = 0;  ///< in elements
  std::uint64_t count = 0;   ///< in elements
};

/// What a step does.
enum class StepKind : std::uint8_t {
  send,         ///< send src to peer
  recv,         ///< receive from peer into dst
  recv_reduce,  ///< dst = src (op) message from peer
  copy,         ///< dst = src (local)
  reduce,       ///< dst = src (op) src2 (local; for fixed-order reductions)
  encode,       ///< dst (packed) = encode(src [+ residual src2]); residual src2 updated
  decode,       ///< dst = decode(src packed); with sum_start, +0.0f + decode(src)
  decode_add,   ///< dst = dst + decode(src packed) (f32)
  scale,        ///< dst = src * the call's factor (premul_sum; local)
};

/// True for the steps that run on the rank itself (no peer): in plan order.
constexpr bool is_local(StepKind k) noexcept {
  return k != StepKind::send && k != StepKind::recv && k != StepKind::recv_reduce;
}

/// One step of one rank's plan.
struct Step {
  Step() = default;
  /// A step of `step_kind` with `peer_rank` (-1: a local step) from `from` to `to` (an
  /// empty Region where the kind has no such side); the other fields keep their defaults.
  Step(StepKind step_kind, int peer_rank, const Region& from, const Region& to, bool finish = false,
       std::uint32_t phase_index = 0)
      : kind(step_kind), finalize(finish), peer(peer_rank), src(from), dst(to), phase(phase_index) {}

  StepKind kind = StepKind::copy;
  bool finalize = false;  ///< apply the op's finishing touch to dst when done
  std::int32_t peer = -1;
  Region src;
  Region src2;  ///< second operand of a local reduce
  Region dst;
  std::uint32_t dep_begin = 0;  ///< dependencies are deps[dep_begin, dep_begin + dep_count)
  std::uint32_t dep_count = 0;
  std::uint32_t phase = 0;      ///< index into Plan::phase_names, for error messages
  /// premul_sum plans: a recv_reduce or reduce whose src is this rank's input multiplies
  /// it by the call's factor first (dst = other + scale(src), the product rounded), so the
  /// input needs no separate scale pass where it is first summed.
  bool scale_src = false;
  // Compressed plans only:
  bool sum_start = false;        ///< decode: the first term of a sum from +0.0f
  std::uint8_t stream = 0;       ///< encode: compression::Phase (worker 0, owner 1) of the RNG stream
  std::int32_t stream_rank = 0;  ///< encode: the rank that keys the RNG stream (a group position)
  std::uint64_t at = 0;          ///< encode: global index of src's first value (keys the RNG)
};

/// What an algorithm is asked to plan.
struct PlanRequest {
  PlanRequest() = default;
  /// `what` over `elements` elements (the per-call count) of `bytes_per_element` bytes
  /// on `ranks` ranks; the other fields keep their defaults (rank 0, ring, default
  /// slices, ...) for the caller to set.
  PlanRequest(Collective what, int ranks, std::uint64_t elements, std::size_t bytes_per_element = 4,
              ReduceOp reduce_op = ReduceOp::sum)
      : collective(what), world(ranks), count(elements), elem_size(bytes_per_element), op(reduce_op) {}

  Collective collective = Collective::allreduce;
  Algorithm algorithm = Algorithm::ring;
  int rank = 0;
  int world = 1;
  std::uint64_t count = 0;       ///< the per-call count (see buffer_counts())
  std::size_t elem_size = 4;     ///< bytes per element, to size pipeline slices
  ReduceOp op = ReduceOp::sum;
  std::size_t slice_bytes = 512 * 1024;  ///< pipeline slice
  int root = 0;                ///< broadcast / reduce / gather / scatter root
  bool deterministic = false;  ///< fixed reduction order (same bits for every algorithm)
  /// Host index of every rank (size world), for topology-aware plans: hierarchical
  /// needs it; rings and chains (ring, allgather, reduce_scatter, broadcast, reduce)
  /// then visit ranks host by host. Null means unknown: every plan works without it.
  /// Plans differ with it, so it belongs in any plan cache key (it is fixed per
  /// communicator).
  std::shared_ptr<const std::vector<int>> host_of;
  /// Compressed all-reduce (f32 sum/avg): the concrete codec; CodecKind::none for every
  /// other plan. The algorithm is then the codec's own (see compressed.cpp) and
  /// `algorithm` must be automatic.
  compression::CodecSpec codec;
  /// Compressed plans: encode with error feedback (residual buffers).
  bool feedback = false;
  /// Compressed plans: the steps run on a device, where each codec step is one launch
  /// whatever its size: the owner decodes and encodes a whole piece per step instead of
  /// one cache-sized frame at a time. The messages (and every bit of the result) are the
  /// same either way; only this rank's compute steps differ.
  bool on_device = false;
  /// The v-collectives' block sizes (`count` then only sizes the call for logs, metrics
  /// and inline running: the larger of this rank's two buffers; null for the others):
  /// allgatherv and reduce_scatter_v: element count of each rank's block (size world);
  /// alltoallv: this rank's view, size 2 * world: what it sends each rank, then what it
  /// receives from each rank (all a rank knows at run time; the verifier takes the whole
  /// matrix, [from * world + to], and hands each rank its view). Blocks lie back to back
  /// in rank order.
  std::shared_ptr<const std::vector<std::uint64_t>> counts;
};

/// Where each rank's block lies in one of a collective's buffers: block j is
/// [at[j], at[j] + count[j]). Every block has the same size for the plain collectives.
struct BlockLayout {
  std::vector<std::uint64_t> at, count;
  std::uint64_t total = 0;
  Region region(Buffer b, std::size_t j) const noexcept { return Region{b, at[j], count[j]}; }
};

/// The per-rank blocks of an all-gather's output or a reduce-scatter's input (count each,
/// or PlanRequest::counts for allgatherv/reduce_scatter_v).
BlockLayout rank_blocks(const PlanRequest& req);
/// An all-to-all's input of req.rank: block j goes to rank j (row req.rank for alltoallv).
BlockLayout sent_blocks(const PlanRequest& req);
/// An all-to-all's output of req.rank: block j comes from rank j (column req.rank for alltoallv).
BlockLayout received_blocks(const PlanRequest& req);

/// Element counts of a collective's two user buffers (see buffer_counts()).
struct BufferCounts {
  std::uint64_t input = 0;
  std::uint64_t output = 0;
};

/// Elements of the input and output buffers the plan of `req.rank` addresses (0: the
/// plan never touches that buffer, so the caller may pass null):
///
/// | collective     | input         | output                 | result on rank r                       |
/// |----------------|---------------|------------------------|----------------------------------------|
/// | allreduce      | count         | count                  | out[i] = op over all ranks of in[i]    |
/// | reduce         | count         | count on root, else 0  | root: out[i] = op of all in[i]         |
/// | broadcast      | count on root, else 0 | count          | out[i] = root's in[i]                  |
/// | allgather      | count         | count * world          | out[j*count+i] = rank j's in[i]        |
/// | reduce_scatter | count * world | count                  | out[i] = op of all in[r*count+i]       |
/// | alltoall       | count * world | count * world          | out[j*count+i] = rank j's in[r*count+i]|
/// | gather         | count         | count * world on root, else 0 | root: out[j*count+i] = rank j's in[i] |
/// | scatter        | count * world on root, else 0 | count  | out[i] = root's in[r*count+i]          |
/// | allgatherv     | counts[r]     | sum of counts          | block j = rank j's input               |
/// | reduce_scatter_v | sum of counts | counts[r]            | out[i] = op of all in[at_r + i]        |
/// | alltoallv      | row r's sum   | column r's sum         | block j = rank j's block r             |
///
/// (v-collectives: blocks back to back in rank order, at_r = sum of counts before r;
/// in place as their plain kin, where alltoallv in place needs equal send and receive
/// layouts.)
///
/// (`count` is PlanRequest::count, the per-call count the API takes.) avg divides
/// reduced elements by the world size exactly once (Step::finalize).
///
/// In-place calls: allreduce, reduce, broadcast and alltoall alias input and output
/// (same pointer); allgather (and gather, on the root) in place means rank r's input *is*
/// output[r*count, (r+1)*count); reduce_scatter (and scatter, on the root) in place means
/// the output *is* input[r*count, (r+1)*count). Plans never write their input buffer, and every plan is correct both
/// in place and out of place (the verifier proves both), so one cached plan serves both
/// kinds of call; plans also address `Plan::scratch_count` elements of scratch that
/// the engine provides (uninitialized, private to the operation).
BufferCounts buffer_counts(const PlanRequest& req) noexcept;

/// The steps of one rank, plus indexes the executor and verifier use.
struct Plan {
  PlanRequest request;
  std::uint64_t scratch_count = 0;  ///< elements of scratch the plan addresses
  /// Compressed plans: encoded values of the packed buffer, the frame its regions are
  /// aligned to (compression::frame_values), and the f32 values of each residual
  /// buffer (indexed feedback_worker - Buffer::feedback_worker; 0 without feedback).
  std::uint64_t packed_count = 0;
  std::uint64_t packed_frame = 1;
  std::uint64_t feedback_count[2] = {0, 0};
  std::vector<Step> steps;
  std::vector<std::uint32_t> deps;
  std::vector<const char*> phase_names;  ///< indexed by Step::phase
  /// What was built, where the Algorithm enum cannot say it: "deterministic" (the fixed
  /// reduction order, whatever algorithm was asked), "pairwise" (all-to-all),
  /// "two-phase", "sparse all-gather", "hierarchical two-phase" (compressed). Null:
  /// the algorithm's own name.
  const char* label = nullptr;

  /// The name logs, errors and explanations give this plan: the label, else the
  /// algorithm's name.
  const char* name() const noexcept { return label != nullptr ? label : braid::to_string(request.algorithm).data(); }

  /// Peers this rank exchanges messages with (sorted, unique): the connections
  /// the engine must set up (lazily) before running the plan.
  std::vector<int> peers;

  /// Appends a step depending on `deps_of` and returns its index.
  std::uint32_t add(Step step, std::initializer_list<std::uint32_t> deps_of = {});
  /// Same, with the dependencies in a vector (entries equal to kNoStep are ignored).
  std::uint32_t add(Step step, const std::vector<std::uint32_t>& deps_of);
  /// Fills `peers`; call when the builder is done.
  void seal();
  /// Human-readable listing (for BRAID_DEBUG=TRACE and test failures).
  std::string describe() const;
};

/// Marker for "no step" in dependency lists.
inline constexpr std::uint32_t kNoStep = 0xffffffffu;

/// Splits `count` elements into `parts` nearly equal contiguous parts; returns the
/// offset of part i (i in [0, parts]; part i is [offset(i), offset(i+1))).
inline std::uint64_t part_offset(std::uint64_t count, std::uint64_t parts, std::uint64_t i) noexcept {
  const std::uint64_t base = count / parts, rem = count % parts;
  return i * base + (i < rem ? i : rem);
}

/// Builds the plan of `req.rank` for `req`. `Plan::request.algorithm` says which
/// algorithm was used (automatic resolved). Throws braid::Error(InvalidUsage) for a bad
/// rank or root, braid::Error(Unsupported) for an algorithm the collective does not
/// offer, naming those it does.
std::shared_ptr<const Plan> build_plan(const PlanRequest& req);

/// The algorithms build_plan() offers for a collective (besides automatic). The
/// communicator should pass a forced algorithm only for collectives that offer it.
std::vector<Algorithm> algorithms_for(Collective c);

}  // namespace braid::collectives
