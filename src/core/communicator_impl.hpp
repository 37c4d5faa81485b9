// Private state of braid::Communicator, shared by communicator.cpp and bootstrap.cpp.
#pragma once

#include <braid/communicator.hpp>

#include "collectives/plan.hpp"
#include "collectives/tuner.hpp"
#include "compression/choose.hpp"
#include "compression/codec.hpp"
#include "compression/error_feedback.hpp"
#include "core/config.hpp"
#include "core/comm_parts.hpp"
#include "core/compressor.hpp"
#include "core/engine.hpp"
#include "core/measured_tuner.hpp"
#include "core/plan_cache.hpp"
#include "core/topology.hpp"

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

namespace braid {

struct Communicator::Impl final : core::Poster {
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

  core::PlanCache plans{cfg.plan_cache};

  /// `address_hint`: where the bootstrap store lives, used as the master address when
  /// the configuration has none (from_unique_id), so TCP binds the interface that
  /// reaches it.
  Impl(std::shared_ptr<Store> store, int rank, int size, const CommOptions& options,
       const std::string& address_hint = {});
  ~Impl();

  /// Which host each rank is on (this rank's identity: CommOptions::host_id, BRAID_HOST_ID
  /// or hostname + boot id); asked by the engine's router, the tuner and compression.
  std::shared_ptr<core::Topology> topology;
  std::atomic<std::uint64_t> next_p2p{1};
  std::atomic<std::uint64_t> next_split{0};

  collectives::PlanRequest request(collectives::Collective c, std::uint64_t count, std::size_t elem_size,
                                   ReduceOp op) const override;
  Work collective(collectives::Collective c, const void* send, void* recv, std::size_t count, DataType dtype,
                  ReduceOp op, int root, Algorithm algo, bool deterministic, std::chrono::milliseconds timeout,
                  const char* what);
  Work p2p(bool is_send, const void* buf, std::size_t count, DataType dtype, int peer, const P2POptions& options);
  /// Chooses the algorithm of automatic calls (made once the topology is known).
  std::unique_ptr<core::MeasuredTuner> tuner;
  Work post(core::Posting p) override;
  void check_same_call(const collectives::Plan& plan, DataType dtype, ReduceOp op, const char* what, bool automatic);
  std::atomic<std::uint64_t> next_check{0};

  /// Compression: codec choice, error-feedback residuals, the compressed all-reduce.
  std::unique_ptr<core::Compressor> compressor;
  /// Communicator::split (store-only, collective in call order).
  Communicator split_impl(int color, int key);
  Work post_task(std::function<void()> task, std::string name, std::shared_ptr<void> keepalive) override;
};

}  // namespace braid
