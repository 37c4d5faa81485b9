// The communicator's placement: host identities read once from the store.
#include "core/topology.hpp"

#include <braid/error.hpp>

#include <unistd.h>

#include <algorithm>
#include <fstream>

namespace braid::core {

bool Layout::uniform() const noexcept {
  return std::all_of(ranks_of_host.begin(), ranks_of_host.end(),
                     [&](const std::vector<int>& r) { return r.size() == ranks_of_host.front().size(); });
}

Topology::Topology(std::shared_ptr<Store> store, int rank, int size, std::string host_id,
                   std::chrono::milliseconds timeout, bool rdma, const std::string& gpu)
    : store_(std::move(store)), rank_(rank), size_(size), host_id_(std::move(host_id)), timeout_(timeout),
      rdma_(rdma) {
  known_.assign(static_cast<std::size_t>(size_), std::string());
  known_[static_cast<std::size_t>(rank_)] = host_id_;
  rdma_of_.assign(static_cast<std::size_t>(size_), -1);
  rdma_of_[static_cast<std::size_t>(rank_)] = rdma_ ? 1 : 0;
  // The fabric first: whoever sees this rank's host sees its fabric too.
  store_->set("fabric/" + std::to_string(rank_), rdma_ ? "rdma" : "none");
  store_->set("gpu/" + std::to_string(rank_), gpu.empty() ? "none" : gpu);
  store_->set("host/" + std::to_string(rank_), host_id_);
}

bool Topology::has_rdma(int peer) const {
  const auto p = static_cast<std::size_t>(peer);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (rdma_of_.at(p) >= 0) return rdma_of_[p] == 1;
  }
  const std::string v = store_->get("fabric/" + std::to_string(peer), std::chrono::seconds(10));
  std::lock_guard<std::mutex> lock(mu_);
  rdma_of_[p] = v == "rdma" ? 1 : 0;
  return rdma_of_[p] == 1;
}

std::string Topology::gpu_of(int r) const {
  const std::string v = store_->get("gpu/" + std::to_string(r), std::chrono::seconds(10));
  return v == "none" ? "" : v;
}

std::string Topology::local_host_id(const std::string& override_id) {
  if (!override_id.empty()) return override_id;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return std::string(host) + "/" + boot;
}

std::optional<bool> Topology::same_host(int peer) const {
  const auto p = static_cast<std::size_t>(peer);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!known_.at(p).empty()) return known_[p] == host_id_;
  }
  // Outside the lock: a store round trip must not hold up other readers.
  const std::string key = "host/" + std::to_string(peer);
  if (!store_->check({key})) return std::nullopt;
  std::string id = store_->get(key, std::chrono::seconds(10));
  std::lock_guard<std::mutex> lock(mu_);
  known_[p] = std::move(id);
  return known_[p] == host_id_;
}

const Layout& Topology::layout() const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (layout_) return *layout_;
  }
  std::vector<std::string> ids(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    const auto i = static_cast<std::size_t>(r);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ids[i] = known_[i];
    }
    if (!ids[i].empty()) continue;
    try {
      ids[i] = store_->get("host/" + std::to_string(r), timeout_);
    } catch (const TimeoutError&) {
      throw TimeoutError("rank " + std::to_string(rank_) + ": rank " + std::to_string(r) +
                         " did not publish its host within " + std::to_string(timeout_.count()) +
                         " ms; has it created this communicator?");
    }
  }
  auto l = std::make_shared<Layout>();
  l->host_of.resize(ids.size());
  for (int r = 0; r < size_; ++r) {
    const std::string& id = ids[static_cast<std::size_t>(r)];
    const auto it = std::find(l->host_names.begin(), l->host_names.end(), id);
    const int h = static_cast<int>(it - l->host_names.begin());
    if (it == l->host_names.end()) {
      l->host_names.push_back(id);
      l->ranks_of_host.emplace_back();
    }
    l->host_of[static_cast<std::size_t>(r)] = h;
    l->ranks_of_host[static_cast<std::size_t>(h)].push_back(r);
  }
  const auto& mine = l->ranks_of_host[static_cast<std::size_t>(l->host_of[static_cast<std::size_t>(rank_)])];
  l->local_size = static_cast<int>(mine.size());
  l->local_rank = static_cast<int>(std::find(mine.begin(), mine.end(), rank_) - mine.begin());
  std::lock_guard<std::mutex> lock(mu_);
  if (!layout_) {
    known_ = ids;
    host_of_ = std::make_shared<const std::vector<int>>(l->host_of);
    layout_ = std::move(l);
  }
  return *layout_;
}

std::shared_ptr<const std::vector<int>> Topology::host_of() const {
  (void)layout();
  std::lock_guard<std::mutex> lock(mu_);
  return host_of_;
}

}  // namespace braid::core
