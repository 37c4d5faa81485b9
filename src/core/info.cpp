// Version, build features and the configuration report (braid_info).
#include <braid/config.hpp>
#include <braid/error.hpp>
#include <braid/info.hpp>

#include "core/config.hpp"
#include "gpu/nvml.hpp"
#include "gpu/runtime.hpp"
#include "core/pmix.hpp"
#include "transport/ibverbs/ibv_discovery.hpp"
#include "transport/registry.hpp"
#if BRAID_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.hpp"
#endif
#if BRAID_HAVE_UCX
#include "transport/ucx/ucx_probe.hpp"
#endif

#include <iomanip>
#include <sstream>

namespace braid {

std::string version() { return BRAID_VERSION_STRING; }

std::string launcher() { return core::Config::global().launcher; }

LaunchEnvironment launch_environment() {
  const core::Config& c = core::Config::global();
  LaunchEnvironment e;
  e.launcher = c.launcher;
  e.rank = c.rank.value_or(-1);
  e.world_size = c.world_size.value_or(-1);
  e.local_rank = c.local_rank.value_or(-1);
  e.local_size = c.local_size.value_or(-1);
  e.master_addr = c.master_addr;
  e.master_port = c.master_port.value_or(0);
  e.store_external = c.store_external;
  e.torch_agent_store = c.torch_agent_store;
  e.auth_token = c.auth_token;
  return e;
}

namespace {
/// The device runtime that device buffers go through (BRAID_GPU_BACKEND), or why none.
std::string runtime_status() {
  try {
    return "device runtime " + core::gpu_runtime().describe();
  } catch (const Error& e) {
    return std::string("device runtime failed to start: ") + e.what();
  }
}
}  // namespace

std::string gpu_status() {
#if BRAID_HAVE_CUDA
  std::string why;
  const int n = kernels::cuda::device_count(&why);
  if (n <= 0) return "no GPU: " + why + "; " + runtime_status();
  return std::to_string(n) + " CUDA device" + (n == 1 ? "" : "s") + "; " + runtime_status();
#else
  return "not built with CUDA (BRAID_WITH_CUDA=OFF, or no nvcc at configure time); " + runtime_status();
#endif
}

std::string build_features() {
  std::ostringstream os;
  auto line = [&](const char* name, int have, const char* what) {
    os << "  " << std::left << std::setw(11) << name << (have ? "yes" : "no ") << "  " << what << "\n";
  };
  for (const auto* e : transport::registry()) line(e->name, 1, e->summary);  // the transports of this build
  line("cuda", BRAID_HAVE_CUDA,
       "CUDA device runtime and kernels; device buffers in every collective, the whole call enqueued on "
       "the device at call time (BRAID_DEVICE_PATH=stream) or staged through pinned host memory (staged; "
       "docs/gpu.md)");
  line("nvml", 1,
       ("NVML, loaded at run time (which GPUs of this host NVLink joins): " +
        gpu::summarize_nvlink(gpu::query_nvlink(core::Config::global().nvml_library)))
           .c_str());
#if BRAID_HAVE_UCX
  // What the UCX loader finds (the ucx transport's own line is the registry's, above).
  line("libucp", 1, ("UCX, loaded at run time: " +
                     transport::ucx::describe(transport::ucx::probe(core::Config::global().ucx_library)))
                        .c_str());
#else
  line("ucx", 0, "UCX support (built when libucx-dev's headers are found)");
#endif
  // The verbs transport's own line is the registry's (above); this is what its loader finds.
  line("libibverbs", BRAID_HAVE_IBVERBS,
       ("libibverbs, loaded at run time (device discovery; the ibverbs transport, hardware-untested): " +
        rdma_status())
           .c_str());
  line("pmix", BRAID_HAVE_PMIX,
       ("PMIx, loaded at run time to find rank 0's store under mpirun or srun --mpi=pmix with no address set: " +
        core::pmix::describe(core::Config::global().pmix_library))
           .c_str());
  line("mpi", BRAID_HAVE_MPI, "Open MPI comparisons in allreduce_bench");
  return os.str();
}

namespace {
/// What discovery finds with BRAID_IBVERBS_LIBRARY; a malformed configuration (the only
/// thing that throws here) becomes the reason.
transport::ibverbs::Discovery discover_rdma() {
  try {
    return transport::ibverbs::discover(core::Config::global().ibverbs_library);
  } catch (const Error& e) {
    transport::ibverbs::Discovery d;
    d.why = e.what();
    return d;
  }
}
}  // namespace

std::string rdma_status() { return transport::ibverbs::summary(discover_rdma()); }

std::string rdma_devices() {
  std::string out;
  for (const auto& l : transport::ibverbs::describe(discover_rdma())) out += l + "\n";
  return out;
}

std::string config_report() {
  std::ostringstream os;
  for (const auto& v : core::config_table()) {
    const auto cur = core::env_value(v.name.c_str());
    os << std::left << std::setw(28) << v.name << std::setw(9) << base::to_string(v.type) << " default="
       << (!v.default_value.empty() ? v.default_value : "(unset)") << "  current=" << (cur ? *cur : "(unset)")
       << "\n    " << v.help << "\n";
  }
  return os.str();
}

std::string config_markdown() {
  std::ostringstream os;
  os << "# Configuration\n\n"
        "<!-- Generated from src/core/config.cpp and the transports' entries (src/transport/*/entry.cpp) by `braid_info --config-markdown`; "
        "tests/unit/test_config.cpp fails when this file is stale. Do not edit by hand. -->\n\n"
        "braid reads these environment variables once per process (src/core/config.cpp is the only\n"
        "place that reads the environment). Per-communicator `CommOptions` and per-call options\n"
        "override them. `braid_info --config` prints them with their current values.\n\n"
        "Types: `duration` is a number with an optional unit (`ms`, `s`, `m`, `h`; default seconds);\n"
        "`bytes` takes `K`, `M`, `G` binary suffixes; `bool` takes 0/1, true/false, yes/no, on/off.\n"
        "A value that does not parse is an `InvalidUsage` error naming the variable.\n\n"
        "## braid variables\n\n| Variable | Type | Default | Meaning |\n|---|---|---|---|\n";
  auto row = [&](const base::Setting& v) {
    os << "| `" << v.name << "` | " << base::to_string(v.type) << " | " << (!v.default_value.empty() ? v.default_value : "—") << " | "
       << v.help << " |\n";
  };
  for (const auto& v : core::config_table())
    if (v.braid_owned) row(v);
  os << "\n## Launcher variables\n\n"
        "When `BRAID_RANK` is unset, braid takes rank and size from the first launcher family that\n"
        "sets a rank: torchrun, then Open MPI's mpirun, then Slurm's srun. The store address comes\n"
        "from `BRAID_MASTER_ADDR`/`BRAID_MASTER_PORT`, else `MASTER_ADDR`/`MASTER_PORT`.\n\n"
        "| Variable | Type | Default | Meaning |\n|---|---|---|---|\n";
  for (const auto& v : core::config_table())
    if (!v.braid_owned) row(v);
  return os.str();
}

}  // namespace braid
