// braid — version, build features and configuration report.
#pragma once

#include <braid/export.hpp>

#include <string>

namespace braid {

/// The library version, "MAJOR.MINOR.PATCH".
BRAID_API std::string version();

/// One line per optional feature with "yes"/"no" (cuda, ucx, ibverbs, mpi, shm...); the
/// run-time loaded ones (libucp, libibverbs) say what was found.
BRAID_API std::string build_features();

/// What this process can do with GPUs, in one line, without failing on a host without
/// a GPU or driver: "not built with CUDA", "no GPU: <why>" (e.g. no driver, no device),
/// or "N CUDA device(s)". The CUDA runtime is linked statically and loads the driver
/// itself on first use, so the library loads and runs on any host. Thread-safe.
BRAID_API std::string gpu_status();

/// This host's RDMA devices in one line, as libibverbs (loaded at run time from
/// BRAID_IBVERBS_LIBRARY) lists them: "none (libibverbs.so.1.14.44.0 loaded; no RDMA
/// devices)", "mlx5_0 port 1 ACTIVE Ethernet MTU 4096 (NUMA 0)", or "unknown: <why>" when
/// libibverbs could not be loaded or this build has no verbs support. Never throws.
/// Thread-safe; queries the devices on each call.
BRAID_API std::string rdma_status();

/// The same in detail, one line per device (NUMA node, PCI path), port (state, link layer,
/// active MTU) and GID (index, address, RoCE version), each line ending in '\n'; the first
/// line names the library loaded. What `braid_info --topology` prints. Never throws.
BRAID_API std::string rdma_devices();

/// Every BRAID_* configuration variable as a table: name, type, default, current
/// value (from this process's environment) and help.
BRAID_API std::string config_report();

/// docs/configuration.md as generated from the configuration table.
BRAID_API std::string config_markdown();

/// Which launcher's variables gave this process its rank and world size, in the order
/// Communicator::from_env() looks for them: "braid" (braidrun, BRAID_RANK), "torchrun"
/// (RANK), "mpirun" (OMPI_COMM_WORLD_RANK), "slurm" (SLURM_PROCID); empty when none.
/// Programs that bootstrap through MPI under mpirun (allreduce_bench, as nccl-tests
/// does) use it to decide whether to call MPI_Init. Thread-safe.
BRAID_API std::string launcher();

/// The launch variables as Communicator::from_env() reads them, parsed once per process.
struct LaunchEnvironment {
  /// As launcher(): "braid", "torchrun", "mpirun", "slurm", or empty.
  std::string launcher;
  /// From the launcher's family of variables; -1 when it does not give them.
  int rank = -1, world_size = -1, local_rank = -1, local_size = -1;
  /// The bootstrap store: BRAID_MASTER_ADDR/PORT, else MASTER_ADDR/PORT; empty and 0 when unset.
  std::string master_addr;
  int master_port = 0;
  /// BRAID_STORE_EXTERNAL: someone else (braidrun) serves the store; rank 0 starts none.
  bool store_external = false;
  /// TORCHELASTIC_USE_AGENT_STORE=True: torchrun's elastic agent serves its own store
  /// (torch's protocol, not braid's) at MASTER_ADDR:MASTER_PORT.
  bool torch_agent_store = false;
  /// BRAID_AUTH_TOKEN ("" when unset): what a client of the launcher's store presents
  /// (TcpStore's `token`); braidrun gives every job one.
  std::string auth_token;
};

/// This process's launch variables (the Python package asks here instead of reading
/// the environment itself, so both sides apply the same precedence). Throws
/// Error(InvalidUsage) naming a malformed variable. Thread-safe.
BRAID_API LaunchEnvironment launch_environment();

}  // namespace braid
