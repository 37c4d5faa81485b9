// Private state of braid::Communicator, shared by communicator.cpp and bootstrap.cpp.
#pragma once

#include <braid/communicator.hpp>

#include "collectives/plan.hpp"
#include "collectives/tuner.hpp"
#include "core/config.hpp"
#include "core/engine.hpp"

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

namespace braid {

struct Communicator::Impl {
  core::Config cfg;
  std::string name;
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{0};
  std::shared_ptr<Store> base_store;  ///< what the caller gave (kept alive)
  std::shared_ptr<Store> store;       ///< this communicator's namespace in it
  std::unique_ptr<core::Engine> engine;
  std::atomic<std::uint64_t> next_seq{1};

  /// A store server this process hosts for the job (rank 0 from the environment,
  /// or the creator of a UniqueId); kept until every rank has left.
  std::unique_ptr<TcpStoreServer> hosted_server;
  bool hosts_store = false;

  mutable std::mutex mu;  ///< guards the plan cache and the lazily computed locality
  std::map<std::tuple<int, int, std::uint64_t, std::size_t, int>, std::shared_ptr<const collectives::Plan>> plans;
  std::deque<std::tuple<int, int, std::uint64_t, std::size_t, int>> plan_order;
  mutable std::optional<std::pair<int, int>> locality;  ///< (local_rank, local_size)

  /// `address_hint`: where the bootstrap store lives, used as the master address when
  /// the configuration has none (from_unique_id), so TCP binds the interface that
  /// reaches it.
  Impl(std::shared_ptr<Store> store, int rank, int size, const CommOptions& options,
       const std::string& address_hint = {});
  ~Impl();

  std::string host_id;  ///< this rank's host identity (CommOptions::host_id or BRAID_HOST_ID or hostname+boot id)
  std::shared_ptr<const std::vector<int>> hosts;  ///< host index per rank, once known
  std::atomic<std::uint64_t> next_p2p{1};
  std::atomic<std::uint64_t> next_split{0};

  std::shared_ptr<const collectives::Plan> plan_for(const collectives::PlanRequest& req);
  Work collective(collectives::Collective c, const void* send, void* recv, std::size_t count, DataType dtype,
                  ReduceOp op, int root, Algorithm algo, bool deterministic, std::chrono::milliseconds timeout,
                  const char* what);
  Work p2p(bool is_send, const void* buf, std::size_t count, DataType dtype, int peer, const P2POptions& options);
  Algorithm choose_algorithm(const collectives::PlanRequest& req);
  collectives::CostModel cost_model() const;
  std::unique_ptr<collectives::Tuner> tuner;  ///< made at the first automatic choice
  std::shared_ptr<const std::vector<int>> host_map();
  Work post(std::shared_ptr<const collectives::Plan> plan, const void* in, void* out, DataType dtype,
            ReduceOp op, std::chrono::milliseconds timeout, const char* what, std::shared_ptr<void> keepalive);
  std::pair<int, int> compute_locality() const;
  void check_same_call(const collectives::Plan& plan, DataType dtype, ReduceOp op, const char* what);
  std::atomic<std::uint64_t> next_check{0};
};

}  // namespace braid
