// The algorithm table (see algorithms.hpp).
#include "collectives/algorithms.hpp"

#include "collectives/builder.hpp"

#include <cmath>

namespace braid::collectives {

namespace {

template <void (*F)(Builder&)>
bool always(Builder& b) {
  F(b);
  return true;
}

double lg(double n) { return std::ceil(std::log2(n)); }

double ring_allreduce(double n, double N, const LinkCost& l, double g) {
  return 2 * (n - 1) * l.alpha + 2 * (n - 1) / n * N * l.beta + (n - 1) / n * N * g;
}
// Double binary tree, pipelined: every rank sends and receives about 2N in total (N up,
// N down, halves over the two trees); depth log2 n each way.
double tree_allreduce(double n, double N, const LinkCost& l, double g) { return 2 * lg(n) * l.alpha + 2 * N * l.beta + N * g; }
double rhd_allreduce(double n, double N, const LinkCost& l, double g) {
  const double p = std::exp2(std::floor(std::log2(n)));
  double t = 2 * std::log2(p) * l.alpha + 2 * (p - 1) / p * N * l.beta + (p - 1) / p * N * g;
  if (p < n) t += 2 * l.alpha + 2 * N * l.beta + N * g;  // fold the extra ranks in and out
  return t;
}
double ring_allgather(double n, double N, const LinkCost& l, double) { return (n - 1) * l.alpha + (n - 1) / n * N * l.beta; }
double ring_reduce_scatter(double n, double N, const LinkCost& l, double g) {
  return (n - 1) * l.alpha + (n - 1) / n * N * (l.beta + g);
}
// Bruck: ceil(log2 n) exchanges, the ring's bytes.
double bruck_allgather(double n, double N, const LinkCost& l, double) { return lg(n) * l.alpha + (n - 1) / n * N * l.beta; }
double bruck_reduce_scatter(double n, double N, const LinkCost& l, double g) {
  return lg(n) * l.alpha + (n - 1) / n * N * (l.beta + g);
}

}  // namespace

const std::vector<AlgorithmRow>& algorithm_table() {
  using C = Collective;
  using A = Algorithm;
  static const std::vector<AlgorithmRow> rows = {
      {C::allreduce, A::ring, nullptr, "ring reduce-scatter then all-gather, pipelined in slices (bandwidth-optimal)",
       always<build_ring_allreduce>, ring_allreduce},
      {C::allreduce, A::tree, nullptr, "double binary tree: two complementary trees, each carrying half the data",
       always<build_tree_allreduce>, tree_allreduce},
      {C::allreduce, A::rhd, nullptr, "recursive halving-doubling (Rabenseifner), extra ranks folded in and out",
       always<build_rhd_allreduce>, rhd_allreduce},
      {C::allreduce, A::hierarchical, nullptr,
       "ring reduce-scatter in each host, ring all-reduce of each block across hosts, ring all-gather in each host",
       build_hierarchical_allreduce, nullptr},
      {C::broadcast, A::ring, nullptr, "pipelined chain from the root, in topology order", always<build_chain_broadcast>,
       nullptr},
      {C::broadcast, A::tree, nullptr, "binomial tree from the root", always<build_binomial_broadcast>, nullptr},
      {C::reduce, A::ring, nullptr, "pipelined chain towards the root, in topology order", always<build_chain_reduce>,
       nullptr},
      {C::reduce, A::tree, nullptr, "binomial tree towards the root", always<build_binomial_reduce>, nullptr},
      {C::allgather, A::ring, nullptr, "ring all-gather, in topology order", always<build_ring_allgather>,
       ring_allgather},
      {C::allgather, A::rhd, "bruck", "Bruck: ceil(log2 n) exchanges at doubling distances (small messages)",
       always<build_bruck_allgather>, bruck_allgather},
      {C::reduce_scatter, A::ring, nullptr, "ring reduce-scatter, pipelined in slices",
       always<build_ring_reduce_scatter>, ring_reduce_scatter},
      {C::reduce_scatter, A::rhd, "bruck",
       "Bruck's all-gather transposed: ceil(log2 n) exchanges at halving distances (small messages)",
       always<build_bruck_reduce_scatter>, bruck_reduce_scatter},
      {C::alltoall, A::ring, "pairwise", "pairwise exchange: step k sends to rank r+k and receives from rank r-k",
       always<build_pairwise_alltoall>, nullptr},
      {C::gather, A::ring, "direct", "every rank sends its block straight to the root", always<build_direct_gather>,
       nullptr},
      {C::scatter, A::ring, "direct", "the root sends each rank its block straight", always<build_direct_scatter>,
       nullptr},
      {C::allgatherv, A::ring, nullptr, "ring all-gather of blocks of their own sizes, in topology order",
       always<build_ring_allgather>, nullptr},
      {C::reduce_scatter_v, A::ring, nullptr, "ring reduce-scatter of blocks of their own sizes, pipelined in slices",
       always<build_ring_reduce_scatter>, nullptr},
      {C::alltoallv, A::ring, "pairwise", "pairwise exchange of blocks of their own sizes",
       always<build_pairwise_alltoall>, nullptr},
  };
  return rows;
}

const AlgorithmRow* find_algorithm(Collective c, Algorithm algorithm) noexcept {
  for (const auto& r : algorithm_table())
    if (r.collective == c && r.algorithm == algorithm) return &r;
  return nullptr;
}

}  // namespace braid::collectives
