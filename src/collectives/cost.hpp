// The α-β-γ cost model: prices any plan by simulating every rank's plan in time.
//
// A link class (shm, tcp, nvlink, ib, pcie) costs α seconds of latency per message and β
// seconds per byte; a rank reduces at γ seconds per byte and copies at `copy_beta`
// seconds per byte. A Topology places ranks on hosts and names the link class used
// between ranks of one host and between hosts (optionally a NIC shared by a host).
//
// simulate() builds the plans of all ranks with build_plan and runs them through a
// discrete-event simulation under the execution rules of plan.hpp (a step starts once
// its dependencies are done and it heads its queue: sends to one peer, receives from
// one peer and local steps each in plan order; the n-th send from A to B matches the
// n-th receive B posts for A). Timing rules, chosen to be simple and conservative:
// - A transfer starts when its send is posted on an eager link class (the transport
//   stages the data: shm's ring slots), and once the matching receive is posted too on
//   a rendezvous class (TCP in the engine never reads a payload before its receive is
//   posted; NVLink/IB copies need the receiver's buffer). The message then passes
//   through the sender's outgoing port, across hosts with a shared NIC through both
//   hosts' NIC directions, and through the receiver's incoming port: each is a FIFO
//   server busy for bytes·(its β) once the message reaches it and it is free, and the
//   message leaves a stage no earlier than the one before (cut-through, as through a
//   switch with buffers). Transfers that share a port thus serialize in the order they
//   were posted, and a port is never held idle by congestion elsewhere. The message
//   lands α after leaving the last stage (α is pipelined latency, not occupancy); the
//   send step is done when the message has left its host.
// - Ports are full duplex: a rank's outgoing and incoming directions are independent,
//   and intra-host and inter-host traffic use separate ports (NVLink vs NIC) unless
//   both are the same link class (one port then).
// - A receive is done when its message has landed and it is posted; a receive-and-
//   reduce then reduces bytes·γ on the rank's compute, which is one serial resource
//   per rank (the progress engine's thread or one reduction kernel at a time); copy
//   and local reduce steps take bytes·copy_beta and bytes·γ on it too.
// - The predicted time is the moment the last step of any rank completes.
//
// For big worlds the number of steps is kept manageable by pricing with larger
// pipeline slices when the plans of all ranks would exceed SimOptions::max_steps
// (see docs/cost-model.md).
#pragma once

#include "collectives/plan.hpp"
#include "collectives/verifier.hpp"

#include <braid/types.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace braid::collectives {

/// Kinds of links between two ranks.
/// pcie: GPU to GPU of one host through PCIe peer-to-peer (no NVLink between them).
/// New classes go at the end: serialize() names them, and deserialize() takes text
/// written before a class existed (it gets the class's default).
enum class LinkClass : std::uint8_t { shm = 0, tcp, nvlink, ib, pcie };

/// Number of link classes; valid LinkClass values are [0, kNumLinkClasses).
inline constexpr int kNumLinkClasses = 5;

/// "shm", "tcp", "nvlink", "ib", "pcie".
const char* to_string(LinkClass c) noexcept;

/// Latency and inverse bandwidth of one link class.
struct LinkCost {
  double alpha = 0;    ///< seconds per message (latency; pipelined, does not occupy the port)
  double beta = 0;     ///< seconds per byte (1 / bandwidth of one direction of one rank's port)
  bool eager = false;  ///< a transfer may start before its receive is posted (staging slots)
};

/// Constants of the α-β-γ model.
struct CostModel {
  std::array<LinkCost, kNumLinkClasses> link{};  ///< indexed by LinkClass
  double gamma = 0;      ///< seconds per byte reduced (bytes of the result)
  double copy_beta = 0;  ///< seconds per byte of a local copy

  LinkCost& operator[](LinkClass c) { return link[static_cast<std::size_t>(c)]; }
  const LinkCost& operator[](LinkClass c) const { return link[static_cast<std::size_t>(c)]; }

  /// Defaults: shm and tcp, γ and copy from measurements on the development machine
  /// (host memory, CPU reductions); nvlink, pcie and ib from published H100 / NDR
  /// figures, as rates a copy achieves rather than line rates.
  /// See docs/cost-model.md for the sources.
  static CostModel defaults();
};

/// Exact text form of a model (hex floats), so that one rank can calibrate and share
/// the result through the store: every rank must tune with identical constants, or
/// ranks would choose different algorithms.
std::string serialize(const CostModel& model);
/// Parses serialize()'s output (surrounding white space, such as a file's final
/// newline, is ignored); throws Error(InvalidUsage) on malformed text, a repeated field
/// or a missing one. Link classes added after the first four (pcie) may be missing:
/// text written before they existed gets their defaults.
CostModel deserialize(std::string_view text);

/// Where ranks live and which links join them.
struct Topology {
  /// Host index of every rank (size = world). Empty: all ranks on one host.
  std::vector<int> host_of;
  LinkClass intra = LinkClass::shm;  ///< between ranks of one host
  LinkClass inter = LinkClass::tcp;  ///< between hosts
  /// When > 0: each host has one NIC of this many bytes per second per direction,
  /// shared by all of its ranks' inter-host traffic (on top of each rank's own inter
  /// port). 0: every rank has its own NIC (DGX-style, one NIC per GPU).
  double nic_bytes_per_s = 0;

  /// All `world` ranks on one host joined by `intra`.
  static Topology single_host(int world, LinkClass intra = LinkClass::shm);
  /// Ranks r on host r / ranks_per_host.
  static Topology hosts(int world, int ranks_per_host, LinkClass intra, LinkClass inter,
                        double nic_bytes_per_s = 0);
  /// Number of distinct hosts (1 when host_of is empty).
  int num_hosts() const;
};

/// Knobs of the simulation.
struct SimOptions {
  /// Upper bound on the steps of all ranks' plans together. When the requested slice
  /// size would exceed it, the plans are rebuilt with larger slices (doubling) until
  /// they fit or stop shrinking; Prediction::slice_bytes says which size was priced.
  std::uint64_t max_steps = 1ull << 23;
};

/// What simulate() found.
struct Prediction {
  double seconds = 0;            ///< completion of the last step of any rank
  std::uint64_t steps = 0;       ///< steps of all ranks
  std::uint64_t messages = 0;    ///< messages exchanged
  double wire_bytes = 0;         ///< bytes sent, all ranks together
  std::size_t slice_bytes = 0;   ///< pipeline slice actually priced
};

/// Builds the plans of all ranks for `base` (its rank is ignored; host_of is taken
/// from `topo` when `base.host_of` is null) and simulates them. Throws what the
/// builder throws (build_plan: Unsupported for what is not implemented), and
/// Error(InvalidUsage) when the plans do not fit together (unmatched messages, size
/// mismatch, deadlock). `builder` is build_plan but for tests (hand-made plans).
Prediction simulate(const PlanRequest& base, const Topology& topo, const CostModel& model,
                    const SimOptions& options = {}, const PlanBuilder& builder = build_plan);

/// simulate(...).seconds.
double predict_seconds(const PlanRequest& base, const Topology& topo, const CostModel& model);

/// nccl-tests' bus-bandwidth factor: busbw = algbw × factor (allreduce 2(n-1)/n;
/// allgather, reduce_scatter, alltoall (n-1)/n; broadcast, reduce 1).
double bus_factor(Collective c, int world) noexcept;

/// nccl-tests' "size" of a call in bytes: the larger of the input and output buffers
/// of one rank (allreduce: count·elem; allgather: count·elem·world; ...).
double size_bytes(Collective c, std::uint64_t count, std::size_t elem_size, int world) noexcept;

/// Closed-form α-β-γ time for `algorithm` on a uniform topology (every pair joined by
/// `link`), `bytes` as size_bytes() defines it. These are the formulas of
/// docs/cost-model.md (one message per ring step, i.e. without slicing; tree and
/// rhd as in the literature). Throws Error(Unsupported) where there is no formula.
double closed_form_seconds(Collective c, Algorithm algorithm, int world, double bytes, const LinkCost& link,
                           double gamma);

/// Closed form of hierarchical all-reduce: ring reduce-scatter inside each host of
/// `ranks_per_host` ranks, ring all-reduce of each 1/L shard across the hosts, ring
/// all-gather inside each host.
double closed_form_hierarchical(int world, int ranks_per_host, double bytes, const LinkCost& intra,
                                const LinkCost& inter, double gamma);

/// One (bytes, seconds) measurement. For links: one-way time of a message of `bytes`
/// (half a ping-pong round trip). For reduce/copy: time of one local operation.
struct Sample {
  double bytes = 0;
  double seconds = 0;
};

/// Least-squares fit of seconds = alpha + bytes·beta, on the relative error (weights
/// 1/seconds², as timing noise grows with the time). With a single distinct size the
/// slope is unknown: returns {mean seconds - bytes·fallback.beta, fallback.beta}. A
/// negative intercept is clamped to 0 (slope refitted through the origin); a
/// non-positive slope keeps fallback.beta. Samples with seconds <= 0 are ignored;
/// none left returns `fallback`. `eager` is fallback's.
LinkCost fit_link(const std::vector<Sample>& samples, const LinkCost& fallback = {});

/// Measurements to calibrate a model from.
struct CalibrationSamples {
  std::vector<std::pair<LinkClass, std::vector<Sample>>> links;  ///< ping-pong per link class
  std::vector<Sample> reduce;  ///< local reductions: seconds = bytes·γ (weighted fit through the origin)
  std::vector<Sample> copy;    ///< local copies: seconds = bytes·copy_beta
};

/// `base` with α, β refitted (fit_link) for every link class that has samples, and γ /
/// copy_beta refitted when reduce / copy samples are given. Deterministic: identical
/// samples give identical models.
CostModel calibrate(const CostModel& base, const CalibrationSamples& samples);

}  // namespace braid::collectives
