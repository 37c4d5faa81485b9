// The smallest useful braid program: average a gradient-sized vector across ranks.
//
//   build/tools/braidrun -n 4 -- build/examples/allreduce_example
#include <braid/braid.hpp>

#include <cstdio>
#include <vector>

int main() {
  try {
    braid::Communicator comm = braid::Communicator::from_env();
    std::vector<float> grad(1 << 20, static_cast<float>(comm.rank()));
    braid::Work work = comm.allreduce(grad.data(), grad.data(), grad.size(), braid::DataType::f32,
                                      braid::ReduceOp::avg);
    work.wait();
    const float expect = static_cast<float>(comm.size() - 1) / 2.0f;
    if (comm.rank() == 0)
      std::printf("rank 0 of %d: grad[0] = %g (expected %g)\n", comm.size(), grad[0], expect);
    return grad[0] == expect ? 0 : 1;
  } catch (const braid::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
