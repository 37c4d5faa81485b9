// braid_info: version, build features and configuration of this braid installation.
#include <braid/braid.hpp>

#include <CLI/CLI.hpp>

#include <functional>
#include <iostream>
#include <string>

namespace {
std::string indent(const std::string& lines) {
  std::string out;
  std::size_t at = 0;
  while (at < lines.size()) {
    const std::size_t nl = lines.find('\n', at);
    const std::size_t end = nl == std::string::npos ? lines.size() : nl + 1;
    out += "  " + lines.substr(at, end - at);
    at = end;
  }
  return out;
}
// Joins the job the environment describes, runs `body` on every rank, and waits for every
// rank before leaving (rank 0 prints; the others must not tear the job down under it).
// The exit status: 0, or 1 with braid's error on stderr.
int in_job(const std::function<void(braid::Communicator&)>& body) {
  try {
    braid::Communicator comm = braid::Communicator::from_env();
    body(comm);
    comm.barrier().wait();
  } catch (const braid::Error& e) {
    std::cerr << "braid_info: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"braid_info: what this braid build can do and how it is configured"};
  bool config = false, markdown = false, topology = false;
  app.add_flag("-c,--config", config, "print every BRAID_* variable with its default and current value");
  app.add_flag("--config-markdown", markdown, "print docs/configuration.md as generated from the table");
  app.add_flag("-t,--topology", topology,
               "join the job described by the environment (run under braidrun, mpirun, torchrun or srun) and, on "
               "rank 0, print its hosts, ranks, each rank's GPU, rank 0's host's NICs (PCI address, NUMA node, "
               "distance from rank 0's GPU), the transport of every pair and rank 0's host's RDMA devices");
  bool links = false;
  app.add_flag("-l,--links", links,
               "join the job described by the environment and measure the link between hosts as codec auto "
               "does (rank 0 and the first rank on another host: latency of 8-byte round trips, bandwidth of "
               "4 MiB messages); rank 0 prints the figures");
  CLI11_PARSE(app, argc, argv);
  if (links) {
    return in_job([](braid::Communicator& comm) {
      const auto m = comm.link_between_hosts();
      if (comm.rank() != 0) return;
      if (m.measured)
        std::cout << "link between hosts (rank " << m.rank_a << " <-> rank " << m.rank_b << ", measured): latency "
                  << m.latency_us << " us, bandwidth " << m.bandwidth_gbps << " GB/s (" << m.bandwidth_gbps * 8
                  << " Gbit/s)\n";
      else
        std::cout << "link between hosts: none (all " << comm.size() << " ranks on one host)\n";
    });
  }
  if (topology) {
    return in_job([](braid::Communicator& comm) {
      const std::string text = comm.describe_topology();
      // The detail behind describe_topology()'s one line, for rank 0's host.
      if (comm.rank() == 0) std::cout << text << "RDMA devices (rank 0's host):\n" << indent(braid::rdma_devices());
    });
  }
  if (markdown) {
    std::cout << braid::config_markdown();
    return 0;
  }
  std::cout << "braid " << braid::version() << "\nbuild features:\n" << braid::build_features()
            << "gpu: " << braid::gpu_status() << "\n";
  if (config) std::cout << "\nconfiguration:\n" << braid::config_report();
  return 0;
}
