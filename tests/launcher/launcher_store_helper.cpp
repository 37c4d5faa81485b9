// A rank program for braidrun's store test: connects a braid::TcpStore client to the
// store braidrun hosts (BRAID_MASTER_ADDR:BRAID_MASTER_PORT, BRAID_STORE_EXTERNAL=1),
// publishes one key per rank and reads every other rank's key back. The store serves only
// clients with the job's BRAID_AUTH_TOKEN (braidrun makes one): a client without it must
// be refused with an error that says so.
#include "rank_env.hpp"

#include <braid/error.hpp>
#include <braid/store.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

using launcher_test::env;

int main() {
  try {
    if (env("BRAID_STORE_EXTERNAL") != "1") {
      std::fprintf(stderr, "BRAID_STORE_EXTERNAL is not 1\n");
      return 1;
    }
    const int rank = std::atoi(env("BRAID_RANK").c_str());
    const int size = std::atoi(env("BRAID_WORLD_SIZE").c_str());
    const std::string addr = env("BRAID_MASTER_ADDR");
    const int port = std::atoi(env("BRAID_MASTER_PORT").c_str());
    if (addr.empty() || port <= 0 || port > 65535 || size < 1) {
      std::fprintf(stderr, "bad launch environment: addr='%s' port=%d size=%d\n", addr.c_str(), port, size);
      return 1;
    }
    const std::string token = env("BRAID_AUTH_TOKEN");
    if (token.empty()) {
      std::fprintf(stderr, "braidrun gave this rank no BRAID_AUTH_TOKEN\n");
      return 1;
    }
    try {
      braid::TcpStore stranger(addr, static_cast<std::uint16_t>(port), false, std::chrono::seconds(10), "wrong");
      std::fprintf(stderr, "the store accepted a client with a wrong token\n");
      return 1;
    } catch (const braid::Error& e) {
      if (e.code() != braid::ErrorCode::InvalidUsage || !std::strstr(e.what(), "does not know the token this client has")) {
        std::fprintf(stderr, "a wrong token gave: %s\n", e.what());
        return 1;
      }
    }
    // is_server = false: the server must already be there, hosted by braidrun.
    braid::TcpStore store(addr, static_cast<std::uint16_t>(port), false, std::chrono::seconds(10), token);
    store.set("launcher_test/rank" + std::to_string(rank), "value" + std::to_string(rank));
    const auto arrived = store.add("launcher_test/arrived", 1);
    for (int q = 0; q < size; ++q) {
      std::string v = store.get("launcher_test/rank" + std::to_string(q), std::chrono::seconds(20));
      if (v != "value" + std::to_string(q)) {
        std::fprintf(stderr, "rank %d read '%s' for rank %d\n", rank, v.c_str(), q);
        return 1;
      }
    }
    std::printf("rank %d store ok (arrival %lld)\n", rank, static_cast<long long>(arrived));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "store helper: %s\n", e.what());
    return 1;
  }
}
