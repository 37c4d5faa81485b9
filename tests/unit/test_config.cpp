// The configuration table: parsing, errors, and docs/configuration.md kept current.
#include "core/config.hpp"

#include <braid/config.hpp>
#include <braid/error.hpp>
#include <braid/info.hpp>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

using namespace braid;
using namespace braid::core;

namespace {
Config parse(const std::map<std::string, std::string>& env) {
  return Config::parse([&](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}
}  // namespace

TEST(Config, Defaults) {
  const Config c = parse({});
  EXPECT_EQ(c.timeout, std::chrono::seconds(300));
  EXPECT_EQ(c.chunk_bytes, 512u * 1024);
  EXPECT_EQ(c.settings.integer("BRAID_SOCKETS_PER_PEER"), 2) << "a transport's row, default from its entry";
  EXPECT_EQ(c.settings.bytes("BRAID_SHM_SLOT_BYTES"), 512u * 1024);
  EXPECT_EQ(c.transport, "auto");
  EXPECT_EQ(c.plan_cache, 64u);
  EXPECT_TRUE(c.tune_measure);
  EXPECT_DOUBLE_EQ(c.codec_max_error, 0.004);
  EXPECT_EQ(c.spin_us, -1);
  EXPECT_FALSE(c.rank.has_value());
  EXPECT_EQ(c.log_level, LogLevel::warn);
}

TEST(Config, ParsesEveryType) {
  const Config c = parse({{"BRAID_TIMEOUT", "1500ms"}, {"BRAID_CHUNK_BYTES", "1M"}, {"BRAID_DEBUG", "info"},
                          {"BRAID_SOCKETS_PER_PEER", "4"}, {"BRAID_CHECK_ARGS", "yes"}, {"BRAID_SPIN_US", "0"},
                          {"BRAID_SOCKET_IFNAME", "eth1"}});
  EXPECT_EQ(c.timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(c.chunk_bytes, 1u << 20);
  EXPECT_EQ(c.log_level, LogLevel::info);
  EXPECT_EQ(c.settings.integer("BRAID_SOCKETS_PER_PEER"), 4);
  EXPECT_TRUE(c.check_args);
  EXPECT_EQ(c.spin_us, 0);
  EXPECT_EQ(c.settings.text("BRAID_SOCKET_IFNAME"), "eth1");
  EXPECT_EQ(parse({{"BRAID_SPIN_US", "AUTO"}}).spin_us, -1);
  EXPECT_EQ(parse({{"BRAID_TRANSPORT", "TCP"}}).transport, "tcp");
  EXPECT_EQ(parse({{"BRAID_TIMEOUT", "2m"}}).timeout, std::chrono::minutes(2));
  EXPECT_EQ(parse({{"BRAID_TIMEOUT", "30"}}).timeout, std::chrono::seconds(30));
}

TEST(Config, BadValuesNameTheVariable) {
  for (const auto& [k, v] : std::map<std::string, std::string>{{"BRAID_TIMEOUT", "soon"},
                                                               {"BRAID_CHUNK_BYTES", "12Q"},
                                                               {"BRAID_SOCKETS_PER_PEER", "0"},
                                                               {"BRAID_DEBUG", "LOUD"},
                                                               {"BRAID_CHECK_ARGS", "maybe"},
                                                               {"BRAID_RANK", "-1"},
                                                               {"BRAID_TRANSPORT", "pigeon"},
                                                               {"BRAID_SHM_SLOT_BYTES", "6000"},
                                                               {"BRAID_CHUNK_BYTES", "1K"},
                                                               {"BRAID_CODEC_MAX_ERROR", "2"}}) {
    try {
      parse({{k, v}});
      ADD_FAILURE() << k << "=" << v << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
      EXPECT_NE(std::string(e.what()).find(k), std::string::npos) << e.what();
    }
  }
}

TEST(Config, LauncherFamiliesInOrder) {
  auto c = parse({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "10.0.0.1"},
                  {"MASTER_PORT", "29500"}});
  EXPECT_EQ(c.launcher, "torchrun");
  EXPECT_EQ(*c.rank, 3);
  EXPECT_EQ(*c.world_size, 8);
  EXPECT_EQ(*c.local_rank, 1);
  EXPECT_EQ(c.master_addr, "10.0.0.1");
  EXPECT_EQ(*c.master_port, 29500);
  EXPECT_FALSE(c.torch_agent_store);
  EXPECT_TRUE(parse({{"RANK", "0"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}}).torch_agent_store);
  EXPECT_FALSE(parse({{"RANK", "0"}, {"TORCHELASTIC_USE_AGENT_STORE", "False"}}).torch_agent_store);
  // BRAID_* wins over torchrun's variables; the Python package reads these through
  // braid::launch_environment() (it used to read RANK first itself).
  c = parse({{"BRAID_RANK", "1"}, {"BRAID_WORLD_SIZE", "2"}, {"RANK", "5"}, {"BRAID_MASTER_ADDR", "h1"},
             {"MASTER_ADDR", "h2"}});
  EXPECT_EQ(c.launcher, "braid");
  EXPECT_EQ(*c.rank, 1);
  EXPECT_EQ(c.master_addr, "h1");
  c = parse({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(c.launcher, "mpirun");
  EXPECT_EQ(*c.local_size, 2);
  c = parse({{"SLURM_PROCID", "7"}, {"SLURM_NTASKS", "16"}});
  EXPECT_EQ(c.launcher, "slurm");
  EXPECT_EQ(*c.world_size, 16);
}

// Under srun with no address variable, the store is at the step's first node and a port
// derived from the job id; the explicit variables still win.
TEST(Config, SlurmDerivesTheStoreAddressFromItsOwnVariables) {
  EXPECT_EQ(first_slurm_host("node[07-09,12],gpu1"), "node07");
  EXPECT_EQ(first_slurm_host("gpu1,node[1-2]"), "gpu1");
  EXPECT_EQ(first_slurm_host("rack[2-3]-n[001-004]"), "rack2-n001");
  EXPECT_EQ(first_slurm_host("single"), "single");
  EXPECT_EQ(first_slurm_host("bad[x-1]"), "");
  EXPECT_EQ(first_slurm_host("open[1-2"), "");
  auto c = parse({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"}, {"SLURM_JOB_NODELIST", "node[07-08]"},
                  {"SLURM_STEP_NODELIST", "node[08]"}, {"SLURM_JOB_ID", "1234567"}});
  EXPECT_EQ(c.launcher, "slurm");
  EXPECT_EQ(c.master_addr, "node08") << "the step's nodes come before the job's";
  EXPECT_EQ(*c.master_port, 15000 + 4567);
  c = parse({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "a[1-2]"}, {"SLURM_JOB_ID", "9"},
             {"BRAID_MASTER_ADDR", "10.1.1.1"}, {"BRAID_MASTER_PORT", "29500"}});
  EXPECT_EQ(c.master_addr, "10.1.1.1");
  EXPECT_EQ(*c.master_port, 29500);
  // Other launchers never read Slurm's variables.
  c = parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"SLURM_JOB_NODELIST", "a1"}, {"SLURM_JOB_ID", "9"}});
  EXPECT_TRUE(c.master_addr.empty());
  EXPECT_FALSE(c.master_port.has_value());
  EXPECT_THROW(parse({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "n[1-"}}), Error);
}

TEST(Config, HelpersParseSizesAndDurations) {
  EXPECT_EQ(parse_bytes("64K"), 65536u);
  EXPECT_EQ(parse_bytes("3MB"), 3u << 20);
  EXPECT_EQ(parse_bytes("17"), 17u);
  EXPECT_FALSE(parse_bytes("").has_value());
  EXPECT_FALSE(parse_bytes("1.5M").has_value());
  EXPECT_FALSE(parse_bytes("99999999999999999999G").has_value());
  EXPECT_EQ(parse_duration("250ms"), std::chrono::milliseconds(250));
  EXPECT_EQ(parse_duration("1h"), std::chrono::hours(1));
  EXPECT_FALSE(parse_duration("ms").has_value());
  EXPECT_FALSE(parse_duration("5 parsecs").has_value());
}

TEST(Config, TableDocumentsEveryVariable) {
  for (const auto& v : config_table()) {
    EXPECT_NE(std::string(v.help), "") << v.name;
    EXPECT_NE(config_report().find(v.name), std::string::npos) << v.name;
    EXPECT_NE(config_markdown().find(std::string("`") + v.name + "`"), std::string::npos) << v.name;
  }
}

// docs/configuration.md must be exactly what the table generates; regenerate with
//   build/tools/braid_info --config-markdown > docs/configuration.md
TEST(Config, DocsAreCurrent) {
  std::ifstream f(std::string(BRAID_SOURCE_DIR) + "/docs/configuration.md");
  ASSERT_TRUE(f.good()) << "docs/configuration.md is missing";
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_EQ(ss.str(), config_markdown())
      << "docs/configuration.md is stale: run build/tools/braid_info --config-markdown > docs/configuration.md";
}

// The library answers "what about GPUs?" on any host without failing: built without
// CUDA it says so; without a driver or device it says why; otherwise it counts devices.
TEST(Info, GpuStatusSaysWhyThereIsNoGpu) {
  const std::string all = braid::gpu_status();
  ASSERT_FALSE(all.empty());
  // Then the device runtime that device buffers go through (BRAID_GPU_BACKEND).
  const auto at = all.find("; device runtime ");
  ASSERT_NE(at, std::string::npos) << all;
  const std::string s = all.substr(0, at);
#if BRAID_HAVE_CUDA
  const bool none = s.rfind("no GPU: ", 0) == 0;
  const bool some = s.find(" CUDA device") != std::string::npos;
  EXPECT_TRUE(none != some) << s;
  if (none) {
    EXPECT_GT(s.size(), std::string("no GPU: ").size()) << "the reason is missing: " << s;
  }
#else
  EXPECT_EQ(s.rfind("not built with CUDA", 0), 0u) << s;
#endif
  EXPECT_NE(braid::build_features().find("cuda"), std::string::npos);
}
