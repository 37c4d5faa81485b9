// The tuner (see tuner.hpp): price every algorithm build_plan accepts, take the cheapest.
#include "collectives/tuner.hpp"

#include <braid/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string_view>

namespace braid::collectives {

std::string format_bytes(double bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  char buf[32];
  if (u == 0 || bytes == std::floor(bytes)) std::snprintf(buf, sizeof buf, "%.0f %s", bytes, units[u]);
  else std::snprintf(buf, sizeof buf, "%.3g %s", bytes, units[u]);
  return buf;
}

std::string format_seconds(double s) {
  char buf[32];
  if (s >= 1) std::snprintf(buf, sizeof buf, "%.3g s", s);
  else if (s >= 1e-3) std::snprintf(buf, sizeof buf, "%.3g ms", s * 1e3);
  else std::snprintf(buf, sizeof buf, "%.3g us", s * 1e6);
  return buf;
}

std::string explain(Collective collective, double bytes, int world, int hosts, const Choice& choice) {
  std::string s = std::string(to_string(collective)) + " " + format_bytes(bytes) + " x " + std::to_string(world) +
                  (world == 1 ? " rank" : " ranks") + " on " + std::to_string(hosts) + (hosts == 1 ? " host" : " hosts") +
                  ":";
  for (std::size_t i = 0; i < choice.candidates.size(); ++i) {
    s += i ? ", " : " ";
    s += std::string(choice.candidates[i].name) + " " + format_seconds(choice.candidates[i].seconds);
  }
  s += " -> " + std::string(choice.name);
  return s;
}

Choice choose(Collective collective, std::uint64_t count, std::size_t elem_size, ReduceOp op, int world,
              const Topology& topo, const CostModel& model, const TuneOptions& options) {
  PlanRequest req(collective, world, count, elem_size, op);
  req.slice_bytes = options.slice_bytes;
  req.root = options.root;
  req.deterministic = options.deterministic;
  req.host_of = std::make_shared<const std::vector<int>>(
      topo.host_of.empty() ? std::vector<int>(static_cast<std::size_t>(std::max(world, 0)), 0) : topo.host_of);

  Choice choice;
  std::optional<Error> first_error;
  // Every algorithm the table offers for the collective (collectives/algorithms.hpp):
  // a new row becomes a candidate at once.
  for (const Algorithm algo : algorithms_for(collective)) {
    req.algorithm = algo;
    req.rank = 0;
    try {
      // build_plan may resolve one algorithm to another (an alias): price each once.
      const auto plan = build_plan(req);
      if (plan->request.algorithm != algo) continue;
      choice.candidates.push_back({algo, predict_seconds(req, topo, model), plan->name()});
    } catch (const Error& e) {
      if (!first_error) first_error = e;
    }
  }
  if (choice.candidates.empty()) {
    if (first_error) throw *first_error;
    throw Error(ErrorCode::Unsupported, std::string("no algorithm implements ") + to_string(collective));
  }
  const Candidate* best = &choice.candidates[0];
  for (const auto& c : choice.candidates)
    if (c.seconds < best->seconds) best = &c;
  choice.algorithm = best->algorithm;
  choice.seconds = best->seconds;
  choice.name = best->name;
  choice.explanation =
      explain(collective, size_bytes(collective, count, elem_size, world), world, topo.num_hosts(), choice);
  return choice;
}

Experiment Experiment::plan(const Choice& model, int rounds, double within, int block) {
  Experiment e;
  e.block = std::max(block, 1);
  for (const auto& c : model.candidates)
    if (c.seconds <= model.seconds * within) e.candidates.push_back(c.algorithm);
  if (e.candidates.size() < 2 || rounds < 1) {
    e.candidates.assign(1, model.algorithm);
    return e;
  }
  const std::size_t n = e.candidates.size();
  for (int r = 0; r < rounds; ++r)
    for (std::size_t k = 0; k < n; ++k) e.schedule.push_back(e.candidates[(k + static_cast<std::size_t>(r)) % n]);
  return e;
}

std::vector<double> Experiment::medians(const std::vector<double>& seconds) const {
  if (seconds.size() != schedule.size())
    throw Error(ErrorCode::Internal, "Experiment::medians: " + std::to_string(seconds.size()) + " times for " +
                                         std::to_string(schedule.size()) + " scheduled calls");
  std::vector<double> out;
  for (const Algorithm a : candidates) {
    std::vector<double> v;
    for (std::size_t i = 0; i < schedule.size(); ++i)
      if (schedule[i] == a) v.push_back(seconds[i]);
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    out.push_back(n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2])));
  }
  return out;
}

Algorithm Experiment::verdict(const std::vector<double>& agreed) const {
  std::size_t best = 0;
  for (std::size_t i = 1; i < candidates.size() && i < agreed.size(); ++i)
    if (agreed[i] < agreed[best]) best = i;
  return candidates[best];
}

std::string Experiment::explain(const std::vector<double>& agreed) const {
  std::string s = "measured";
  for (std::size_t i = 0; i < candidates.size() && i < agreed.size(); ++i)
    s += (i ? ", " : " ") + std::string(braid::to_string(candidates[i])) + " " + format_seconds(agreed[i]);
  return s + " -> " + std::string(braid::to_string(verdict(agreed)));
}

Tuner::Tuner(int world, Topology topo, CostModel model, TuneOptions options)
    : world_(world), topo_(std::move(topo)), model_(model), options_(options) {
  if (world < 1) throw Error(ErrorCode::InvalidUsage, "Tuner: world must be >= 1");
  if (!topo_.host_of.empty() && topo_.host_of.size() != static_cast<std::size_t>(world))
    throw Error(ErrorCode::InvalidUsage, "Tuner: topology has " + std::to_string(topo_.host_of.size()) +
                                             " ranks for a world of " + std::to_string(world));
}

int Tuner::size_bucket(double bytes) noexcept {
  if (bytes < 64) return static_cast<int>(bytes < 0 ? 0 : bytes);
  return 64 + static_cast<int>(std::floor(4 * std::log2(bytes / 64)));
}

std::shared_ptr<const Choice> Tuner::choose(Collective collective, std::uint64_t count, std::size_t elem_size,
                                            ReduceOp op, bool* first, int root, bool deterministic) {
  const int bucket = size_bucket(size_bytes(collective, count, elem_size, world_));
  const auto key = std::make_tuple(static_cast<int>(collective), elem_size, static_cast<int>(op), deterministic, bucket);
  std::lock_guard<std::mutex> lock(mu_);
  if (first) *first = false;
  if (const auto* cached = cache_.find(key)) return *cached;
  auto c = std::make_shared<const Choice>(price(collective, count, elem_size, op, root, deterministic));
  cache_.insert(key, c);
  if (first) *first = true;
  return c;
}

Choice Tuner::price(Collective collective, std::uint64_t count, std::size_t elem_size, ReduceOp op, int root,
                    bool deterministic) const {
  TuneOptions o = options_;
  o.root = root;
  o.deterministic = deterministic;
  return collectives::choose(collective, count, elem_size, op, world_, topo_, model_, o);
}

std::size_t Tuner::cached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_.size();
}

}  // namespace braid::collectives
