// Links against the installed braid and runs a one-rank and a two-thread all-reduce.
#include <braid/braid.hpp>

#include <cstdio>
#include <thread>
#include <vector>

int main() {
  static_assert(BRAID_VERSION_MAJOR == 0, "config.hpp is installed");
  auto store = std::make_shared<braid::TcpStore>("127.0.0.1", 0, true);
  const std::uint16_t port = store->port();
  std::vector<float> out(2);
  std::thread peer([&] {
    braid::Communicator c(std::make_shared<braid::TcpStore>("127.0.0.1", port), 1, 2);
    float in[] = {1.f, 2.f}, res[2];
    c.allreduce(in, res, 2, braid::DataType::f32, braid::ReduceOp::sum).wait();
  });
  {
    braid::Communicator c(store, 0, 2);
    float in[] = {10.f, 20.f};
    c.allreduce(in, out.data(), 2, braid::DataType::f32, braid::ReduceOp::sum).wait();
  }
  peer.join();
  if (out[0] != 11.f || out[1] != 22.f) {
    std::fprintf(stderr, "wrong result %f %f\n", out[0], out[1]);
    return 1;
  }
  std::printf("braid %s consumer ok\n", braid::version().c_str());
  return 0;
}
