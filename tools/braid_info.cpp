// braid_info: version, build features and configuration of this braid installation.
#include <braid/braid.hpp>

#include <CLI/CLI.hpp>

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
  CLI11_PARSE(app, argc, argv);
  if (topology) {
    try {
      braid::Communicator comm = braid::Communicator::from_env();
      const std::string text = comm.describe_topology();
      // The detail behind describe_topology()'s one line, for rank 0's host.
      if (comm.rank() == 0) std::cout << text << "RDMA devices (rank 0's host):\n" << indent(braid::rdma_devices());
      comm.barrier().wait();
    } catch (const braid::Error& e) {
      std::cerr << "braid_info: " << e.what() << "\n";
      return 1;
    }
    return 0;
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
