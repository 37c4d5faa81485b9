// Who is where: one object per communicator that answers "which host is each rank on,
// which ranks share this rank's host" for every part above (the engine's router, the
// tuner, hierarchical compression, local_rank(), describe_topology()).
//
// Each rank publishes its host identity in the communicator's store when the Topology is
// made ("host/<rank>"). Reads are lazy, so making a communicator does not wait for the
// others: same_host() asks without waiting (the engine's router retries later), layout()
// waits up to the communicator's timeout for every rank, once, and keeps the answer.
// Each rank also publishes its GPU ("gpu/<rank>": device index and PCI bus id, or "none")
// for describe_topology(); the host's NICs come from sysfs (core/host_hardware.hpp).
#pragma once

#include <braid/store.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace braid::core {

/// The whole communicator's placement, the same on every rank.
struct Layout {
  /// Host index per rank; hosts are numbered in order of their lowest rank.
  std::vector<int> host_of;
  /// Host identity per host index.
  std::vector<std::string> host_names;
  /// Ranks of each host, ascending.
  std::vector<std::vector<int>> ranks_of_host;
  int local_rank = 0;  ///< this rank's index among its host's ranks
  int local_size = 1;  ///< ranks on this rank's host
  int hosts() const noexcept { return static_cast<int>(host_names.size()); }
  /// Every host has the same number of ranks.
  bool uniform() const noexcept;
};

class Topology {
 public:
  /// Publishes `host_id` as this rank's host identity in `store` (the communicator's
  /// namespace). `timeout` bounds layout()'s wait for the other ranks.
  /// `rdma`: this rank has an RDMA fabric to other hosts (its UCX reports an rc, dc or ud
  /// transport); published too, so that both ends of a pair make the same choice.
  /// `gpu`: this rank's GPU as describe_topology() prints it ("GPU 0, PCI 0000:1b:00.0"),
  /// "" for none.
  Topology(std::shared_ptr<Store> store, int rank, int size, std::string host_id,
           std::chrono::milliseconds timeout, bool rdma = false, const std::string& gpu = "");

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const std::string& host_id() const noexcept { return host_id_; }

  /// Whether `peer` is on this rank's host; empty while `peer` has not published its
  /// identity (it has not made its communicator yet). Does not wait. Thread-safe.
  std::optional<bool> same_host(int peer) const;
  /// Whether rank `r` has an RDMA fabric to other hosts (the router's PairFacts::rdma is
  /// this for both ends of a pair). For another rank, call after same_host(r) answered or
  /// layout() returned (it published both facts). Thread-safe.
  bool has_rdma(int r) const;
  /// The placement of every rank; waits (up to the timeout) for ranks that have not
  /// published, the first time. Throws braid::TimeoutError naming the rank. Thread-safe.
  const Layout& layout() const;
  /// Rank r's GPU as it published it ("" for none). Call after layout() returned (r
  /// published its GPU before its host). Thread-safe.
  std::string gpu_of(int r) const;
  /// layout().host_of, shared (plan requests keep it).
  std::shared_ptr<const std::vector<int>> host_of() const;

  /// The host identity of this process: `override_id` when given, else hostname + "/" +
  /// boot id (two containers on one machine share a boot id but not a hostname; two
  /// machines never share both).
  static std::string local_host_id(const std::string& override_id);

 private:
  std::shared_ptr<Store> store_;
  int rank_;
  int size_;
  std::string host_id_;
  std::chrono::milliseconds timeout_;
  bool rdma_ = false;
  mutable std::mutex mu_;
  mutable std::vector<signed char> rdma_of_;  ///< per rank: -1 not read yet, 0 no, 1 yes
  mutable std::vector<std::string> known_;  ///< host identity per rank, "" = not read yet
  mutable std::shared_ptr<const Layout> layout_;
  mutable std::shared_ptr<const std::vector<int>> host_of_;
};

}  // namespace braid::core
