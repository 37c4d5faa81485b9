// braid — the communicator.
//
// Contract (read this first):
// - A Communicator is a fixed group of `size()` ranks, each in its own thread or
//   process, that run collectives together. Membership never changes; `split`
//   makes new, smaller communicators.
// - Every collective is asynchronous: it validates its arguments, queues the
//   operation and returns a Work without waiting for peers. The communicator's
//   progress engine (one thread per communicator) runs operations in the order they
//   were issued, which must be the same order on every rank, as with NCCL and MPI.
//   A small call (BRAID_INLINE_BYTES) that finds the engine idle is run by the
//   engine's loop on the calling thread instead, until it completes or stops moving
//   (then the progress thread takes over and the call returns).
// - Buffers belong to the caller and must stay valid and untouched until the Work
//   completes. In-place operation (send == recv) is allowed where noted.
// - Any failure (a peer dies, a deadline passes, abort()) fails the Work in flight
//   with a braid::Error naming collective, sequence number, peer and step, fails the
//   operations queued behind it with an error of the same kind (RemoteError naming
//   the peer, TimeoutError), and puts the communicator in a failed state: every later
//   call fails fast with Aborted.
//   The survivors recover with shrink(): a new communicator of the ranks still alive.
// - Arguments are checked before any byte moves; bad ones throw
//   Error(InvalidUsage) from the call itself.
//
// Thread safety: collectives may be issued from any thread, but issue order must be
// the same on every rank, so issue from one thread or order the calls yourself.
// abort() may be called from any thread at any time.
#pragma once

#include <braid/export.hpp>
#include <braid/metrics.hpp>
#include <braid/options.hpp>
#include <braid/store.hpp>
#include <braid/types.hpp>
#include <braid/work.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

namespace braid {

/// Opaque 128-byte identifier of a communicator being created, NCCL-style: one
/// process calls Communicator::create_unique_id(), hands the bytes to every rank
/// by its own means (MPI_Bcast, a file, a command line), and every rank passes it
/// to Communicator::from_unique_id().
struct UniqueId {
  /// The raw bytes; treat as opaque.
  std::array<char, 128> bytes{};
};

/// Settings of a communicator that are not per call. Zero/empty means "use the
/// configuration" (BRAID_* variables, see docs/configuration.md).
struct CommOptions {
  /// Default deadline of every collective and of set-up.
  std::chrono::milliseconds timeout{0};
  /// Name used in log and error messages (default "braid"); also the communicator's
  /// namespace in the store. The k-th communicator of a name and size that a rank
  /// creates on a store meets the k-th of every other rank, so disjoint groups that
  /// share one store must use different names (or their own PrefixStore), as with
  /// PyTorch's c10d.
  std::string name;
  /// Pipeline slice in bytes (0 = BRAID_CHUNK_BYTES); large collectives move in slices
  /// of at most this size so that sending, receiving and reducing overlap.
  std::size_t chunk_bytes = 0;
  /// Host identity of this rank (empty = BRAID_HOST_ID, else hostname + boot id).
  /// Ranks with equal identities talk over shared memory; tests use it to emulate
  /// several hosts inside one process.
  std::string host_id;
  /// Transport of every pair (empty = BRAID_TRANSPORT): "auto" (shm within a host, tcp
  /// between hosts) or a transport this build has (`braid_info` lists them), which then
  /// serves every pair. Lets one process run communicators over different transports.
  std::string transport;
  /// The GPU whose buffers this communicator takes (-1: the calling thread's current
  /// device when the communicator is created, as NCCL). Device buffers of another GPU
  /// are refused. Ignored without a device runtime (docs/gpu.md).
  int device = -1;
};

/// A group of ranks that run collectives together. Movable, not copyable.
class BRAID_API Communicator {
 public:
  /// Joins a communicator of `size` ranks as `rank` using `store` for set-up.
  /// Blocks until this rank has published its address (not until every rank has
  /// joined: connections are made lazily, only to peers a collective needs).
  /// Throws InvalidUsage for rank/size out of range.
  Communicator(std::shared_ptr<Store> store, int rank, int size, const CommOptions& options = {});

  /// Creates a UniqueId. Starts a store server in this process that lives until
  /// the communicator created from this id in this process is destroyed (or the
  /// process exits if none is). Binds BRAID_SOCKET_IFNAME's address if set,
  /// else the first non-loopback IPv4 address, else 127.0.0.1.
  static UniqueId create_unique_id();

  /// Joins the communicator described by `id` (see UniqueId).
  static Communicator from_unique_id(const UniqueId& id, int rank, int size,
                                     const CommOptions& options = {});

  /// Joins a communicator described by the environment, in this order:
  /// BRAID_RANK/BRAID_WORLD_SIZE, torchrun's RANK/WORLD_SIZE, Open MPI's
  /// OMPI_COMM_WORLD_RANK/SIZE, Slurm's SLURM_PROCID/SLURM_NTASKS; the store is
  /// at BRAID_MASTER_ADDR:BRAID_MASTER_PORT (or MASTER_ADDR:MASTER_PORT), served
  /// by rank 0. With neither set: under mpirun or srun --mpi=pmix (PMIX_NAMESPACE set)
  /// rank 0's UniqueId reaches every rank through the launcher's PMIx server (then every
  /// rank of the job must call from_env, equally often: each call is a fence over the
  /// job, bounded by the timeout); under plain srun the store is on the step's first
  /// node at a port derived from the job id (docs/cluster.md). Throws InvalidUsage
  /// naming the missing variable, Timeout when a rank never joins the PMIx exchange.
  static Communicator from_env(const CommOptions& options = {});

  /// Waits for this rank's outstanding collectives (up to their deadlines), then
  /// closes connections and stops the engine. Never throws.
  ~Communicator();
  /// Moves; the moved-from object may only be destroyed or assigned to.
  Communicator(Communicator&&) noexcept;
  /// Moves; destroys this communicator's previous state first.
  Communicator& operator=(Communicator&&) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  /// This rank's index, 0 <= rank() < size().
  int rank() const noexcept;
  /// Number of ranks.
  int size() const noexcept;
  /// Number of ranks on this host (the same host id, see BRAID_HOST_ID). The first
  /// call waits (up to the communicator's timeout) until every rank has joined, and
  /// throws braid::Error if one does not.
  int local_size() const;
  /// This rank's index among the ranks of its host (same first-call rule).
  int local_rank() const;

  /// recv[i] = op over ranks of send[i], for i < count. send == recv is in-place.
  /// Buffers must not otherwise overlap.
  Work allreduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                 const AllreduceOptions& options = {});

  /// Copies root's `send` into every rank's `recv` (count elements). `send` is read
  /// only on the root (may be null elsewhere); send == recv is in-place.
  Work broadcast(const void* send, void* recv, std::size_t count, DataType dtype,
                 const BroadcastOptions& options = {});

  /// Reduces every rank's `send` (count elements) into root's `recv`; `recv` is
  /// written only on the root (may be null elsewhere); send == recv is in-place.
  Work reduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
              const ReduceOptions& options = {});

  /// Gathers `count` elements from every rank into recv (size()*count, rank order).
  /// In-place when send == recv + rank()*count.
  Work allgather(const void* send, void* recv, std::size_t count, DataType dtype,
                 const AllgatherOptions& options = {});

  /// Reduces size()*count elements of send and leaves block `rank()` (count elements)
  /// in recv. In-place when recv == send + rank()*count.
  Work reduce_scatter(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                      const ReduceScatterOptions& options = {});

  /// Sends block j (count elements) of send to rank j; receives rank j's block into
  /// block j of recv (both size()*count elements). send == recv is in-place.
  Work alltoall(const void* send, void* recv, std::size_t count, DataType dtype,
                const AlltoallOptions& options = {});

  /// Gathers `count` elements from every rank into the root's `recv` (size()*count, rank
  /// order), as MPI_Gather and ncclGather. `recv` is written only on the root (may be null
  /// elsewhere). In place on the root when send == recv + root*count.
  Work gather(const void* send, void* recv, std::size_t count, DataType dtype, const GatherOptions& options = {});

  /// Sends block j (count elements) of the root's `send` (size()*count) to rank j's `recv`,
  /// as MPI_Scatter and ncclScatter. `send` is read only on the root (may be null
  /// elsewhere). In place on the root when recv == send + root*count.
  Work scatter(const void* send, void* recv, std::size_t count, DataType dtype, const ScatterOptions& options = {});

  /// All-gather of blocks of their own sizes (MPI_Allgatherv with the blocks back to back;
  /// torch's all_gather of uneven tensors, FSDP's uneven shards): rank j contributes
  /// counts[j] elements, and every rank's `recv` gets every block, in rank order (the sum
  /// of counts). `counts` has size() entries, the same on every rank; a block may be empty.
  /// In place when send == recv + (the counts before rank()).
  Work allgatherv(const void* send, void* recv, const std::vector<std::size_t>& counts, DataType dtype,
                  const AllgatherOptions& options = {});

  /// Reduce-scatter into blocks of their own sizes (MPI_Reduce_scatter): `send` holds the
  /// sum of counts elements, and rank r's `recv` gets block r (counts[r] elements, after
  /// the counts before r) reduced over all ranks. `counts` as for allgatherv. In place
  /// when recv == send + (the counts before rank()). Not in deterministic mode.
  Work reduce_scatter_v(const void* send, void* recv, const std::vector<std::size_t>& counts, DataType dtype,
                        ReduceOp op, const ReduceScatterOptions& options = {});

  /// All-to-all of blocks of their own sizes (MPI_Alltoallv with the blocks back to back;
  /// torch's all_to_all_single with split sizes, MoE token exchange): block j of `send`
  /// (send_counts[j] elements) goes to rank j, and block j of `recv` (recv_counts[j]) comes
  /// from rank j. Rank j's send_counts[r] must equal rank r's recv_counts[j]: where they
  /// differ the receiving rank's call fails with a RemoteError naming the sender and both
  /// sizes (and its communicator with it; the sender hears at its next call). In place
  /// (send == recv) only when send_counts == recv_counts.
  Work alltoallv(const void* send, const std::vector<std::size_t>& send_counts, void* recv,
                 const std::vector<std::size_t>& recv_counts, DataType dtype, const AlltoallOptions& options = {});

  /// Sends count elements to `peer`, matched by the peer's recv with the same tag, in
  /// order. Consecutive send/recv calls run together (like an NCCL group), so two
  /// ranks may exchange both ways without deadlock. `peer` may be this rank: the data is
  /// copied when the matching recv is posted, so post both before waiting for either.
  Work send(const void* buf, std::size_t count, DataType dtype, int peer,
            const P2POptions& options = {});

  /// Receives exactly count elements from `peer` (see send). A size or tag that
  /// differs from the matching send fails both with an error naming the peer.
  Work recv(void* buf, std::size_t count, DataType dtype, int peer, const P2POptions& options = {});

  /// Completes on a rank once every rank has entered it. Implemented as a one-element
  /// all-reduce.
  Work barrier(const BarrierOptions& options = {});

  /// Splits into sub-communicators by `color` (>= 0), ranks ordered by `key` then by
  /// old rank. Every rank must call it, in the same order relative to other calls,
  /// like a collective. Blocks until every rank has called it. The child keeps this
  /// communicator's options (timeout, slices, host identity, transport and GPU), so it
  /// runs where its parent does whichever thread splits it.
  Communicator split(int color, int key);

  /// The communicator of the ranks still alive, numbered in their old order, after a
  /// failure (or to drop ranks from a healthy one, as ncclCommShrink): every surviving rank
  /// calls it, in the same order relative to other shrinks; the ranks that left do not.
  /// The survivors agree on who failed through the store (every caller gets the same
  /// members, even when they saw the failure differently or a rank dies meanwhile): a rank
  /// is left out when it is in some caller's `exclude`, when a failure record in the store
  /// blames it and it has not called shrink, or when it has not called shrink within the
  /// communicator's timeout. Returns once this rank has joined the new communicator; the
  /// child keeps this one's options (timeout, slices, host, transport, GPU) and its
  /// error-feedback residuals, and this communicator stays as it is (a failed one stays
  /// failed). On a healthy communicator call it between collectives (its residuals are
  /// copied). Throws Aborted on a rank the others left out, InvalidUsage for an `exclude`
  /// out of range or naming this rank, Unsupported when the store has no compare_set, and
  /// the store's error when the store is gone (it must outlive any rank: braidrun's,
  /// torchrun's agent's, or a FileStore; docs/reliability.md).
  Communicator shrink(const std::vector<int>& exclude = {});

  /// A communicator of `new_size` ranks: this one's ranks keep their numbers and newcomers,
  /// processes that call join(), take ranks size()..new_size-1 (ncclCommGrow). Every rank of
  /// this communicator calls it, like a collective; it returns once this rank has joined
  /// the new one, and the first collective there waits (up to the timeout) for the
  /// newcomers. The child keeps this one's options; error feedback starts afresh on every
  /// rank (the newcomers have no residuals, and all ranks' step counters must agree). Rank 0
  /// leaves one offer per new rank in the store (under the name the job began with); each
  /// newcomer takes its own, and a later grow replaces one nobody took. Throws InvalidUsage
  /// unless new_size > size(), Aborted on a failed communicator (shrink it first).
  Communicator grow(int new_size);

  /// A newcomer's side of grow(): joins, as `rank` of `size`, the communicator that a job
  /// named `options.name` (default "braid", the name it began with) is growing on `store`
  /// (the job's store: braidrun's, or the one its ranks were made on). Waits up to the
  /// timeout for the offer to `rank` and takes it. Throws InvalidUsage when `rank`/`size` do
  /// not fit the offer or another process took it; not for jobs made from a UniqueId.
  static Communicator join(std::shared_ptr<Store> store, int rank, int size, const CommOptions& options = {});

  /// Fails every outstanding and future operation with Aborted and closes connections.
  /// Safe from any thread, including while another thread waits on a Work. Idempotent.
  void abort() noexcept;

  /// abort() for the whole communicator: this rank records in the store that it revoked
  /// (so that the survivors' shrink counts it alive; waits a second at most for the store),
  /// then fails as abort() does, and tells its
  /// peers, whose pending and later calls fail with an error naming this rank's revoke
  /// (ranks without a connection to this one learn it from the peers they wait on, or at
  /// their deadline at the latest). Survivors then shrink(). Safe from any thread.
  void revoke() noexcept;

  /// Writes every error-feedback residual this rank holds (all ef_keys) to `os`, in
  /// the versioned binary format of docs/codecs.md, for checkpointing. Call between
  /// collectives (not while a compressed all-reduce is in flight).
  void save_error_feedback(std::ostream& os) const;
  /// Replaces this rank's residuals with a checkpoint written by save_error_feedback();
  /// throws Error(InvalidUsage) and changes nothing if the data is damaged. Call
  /// between collectives.
  void restore_error_feedback(std::istream& is);
  /// Like save_error_feedback(os), for the ef_keys that start with `key_prefix` only,
  /// each written without the prefix: the checkpoint of one owner's residuals (one DDP
  /// compression hook, say), restorable under another prefix. Throws Error(InvalidUsage)
  /// when a key equals the prefix. Call between collectives.
  void save_error_feedback(std::ostream& os, const std::string& key_prefix) const;
  /// Like restore_error_feedback(is), for one prefix: the residuals whose ef_keys start
  /// with `key_prefix` are replaced by the checkpoint's, each put back under the prefix;
  /// other keys are kept. Throws Error(InvalidUsage) and changes nothing if the data is
  /// damaged. Call between collectives.
  void restore_error_feedback(std::istream& is, const std::string& key_prefix);
  /// Forgets the residuals of `ef_key` (all keys when empty); the next call starts from
  /// zero. Call between collectives.
  void reset_error_feedback(const std::string& ef_key = {});
  /// Bytes of error-feedback residuals held by this rank.
  std::size_t error_feedback_bytes() const;

  /// True once the communicator has failed or been aborted.
  bool failed() const noexcept;

  /// The flight recorder's dump of this rank (JSON, docs/observability.md): the last
  /// operations (BRAID_TRACE_ENTRIES), then what is running, with each peer's progress,
  /// and what is queued. Also written into BRAID_TRACE_DIR when it is set; `braid_trace`
  /// merges the ranks' files. Local, thread-safe, callable after a failure. Throws
  /// braid::Error(Timeout) if the progress engine does not answer within 10 s.
  std::string dump_trace() const;

  /// This rank's counters since the communicator was made: calls, errors, bytes and a
  /// time histogram per collective, algorithm and codec (docs/observability.md);
  /// Metrics::prometheus() gives them in Prometheus' text format. Local, thread-safe.
  Metrics metrics() const;

  /// Human-readable topology: hosts, their ranks, and the transport each pair of
  /// ranks uses. Waits until every rank has joined (up to the timeout).
  std::string describe_topology() const;

  /// The link between hosts as this communicator measured it, for codec `auto`: rank 0
  /// and the lowest rank on another host exchange small and 4 MiB messages once (about
  /// 0.1 s at 1 Gbit/s), and every rank gets rank 0's figures. Collective on its first
  /// call (every rank calls it, or the first automatic all-reduce across hosts does);
  /// later calls, and children made after it, return what was measured. Every rank on one
  /// host: `measured` false and zeros.
  struct LinkMeasurement {
    bool measured = false;
    int rank_a = -1, rank_b = -1;  ///< the pair measured (ranks of the communicator that measured)
    double latency_us = 0;         ///< one way, half the median round trip of 8 bytes
    double bandwidth_gbps = 0;     ///< GB/s (1e9 bytes), one way, 4 MiB messages
  };
  LinkMeasurement link_between_hosts();

  /// The tuner's choice for an all-reduce of this shape and why: one line with the
  /// predicted time of every algorithm, as BRAID_DEBUG=INFO logs it, e.g.
  /// "allreduce 4 KiB x 2 ranks on 1 host: ring 9.4 us, tree 7.1 us, rhd 6.2 us -> rhd".
  /// When BRAID_ALGO forces an algorithm the line says so. Local: moves no bytes, and
  /// uses the same cache as the calls, so it reports what a call of this size runs.
  std::string explain_allreduce(std::size_t count, DataType dtype, ReduceOp op = ReduceOp::sum,
                                bool deterministic = false) const;

  /// Private implementation.
  struct Impl;

 private:
  explicit Communicator(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

}  // namespace braid
