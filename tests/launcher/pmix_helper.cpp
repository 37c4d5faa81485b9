// Under mpirun, a program that does not use MPI: Communicator::from_env() with no
// BRAID_* or MASTER_* address set must find rank 0's store through PMIx (core/pmix.hpp).
// Two communicators in a row (each from_env call is its own PMIx exchange), each checked
// with an exact all-reduce. Prints "pmix ok" on every rank; with the argument "expect-error"
// it instead expects from_env to throw and prints "pmix error: <message>"; with "absent R"
// rank R never calls from_env (it sleeps 8 s) and the others expect an error, printed
// with the seconds it took.
#include "rank_env.hpp"

#include <braid/braid.hpp>

#include <chrono>
#include <cstdlib>
#include <thread>

#include <cstdio>
#include <cstring>
#include <vector>

namespace {
bool check(braid::Communicator& c, int round) {
  std::vector<double> x(4096, c.rank() + 1.0 + round);
  c.allreduce(x.data(), x.data(), x.size(), braid::DataType::f64, braid::ReduceOp::sum).wait();
  const double n = c.size();
  const double want = n * (n + 1) / 2.0 + n * round;
  for (double v : x)
    if (v != want) {
      std::fprintf(stderr, "rank %d round %d: all-reduce gave %g, want %g\n", c.rank(), round, v, want);
      return false;
    }
  return true;
}
}  // namespace

int main(int argc, char** argv) {
  bool expect_error = argc > 1 && std::strcmp(argv[1], "expect-error") == 0;
  if (argc > 2 && std::strcmp(argv[1], "absent") == 0) {
    if (launcher_test::env("OMPI_COMM_WORLD_RANK") == argv[2]) {
      std::this_thread::sleep_for(std::chrono::seconds(8));
      return 0;
    }
    expect_error = true;
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    for (int round = 0; round < 2; ++round) {
      braid::Communicator c = braid::Communicator::from_env();
      if (expect_error) {
        std::fprintf(stderr, "from_env succeeded where it should have failed\n");
        return 1;
      }
      if (!check(c, round)) return 1;
    }
    std::printf("pmix ok rank\n");
    return 0;
  } catch (const braid::Error& e) {
    if (expect_error) {
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
      std::printf("pmix error after %.1f s: %s\n", took.count(), e.what());
      return 0;
    }
    std::fprintf(stderr, "from_env failed: %s\n", e.what());
    return 1;
  }
}
