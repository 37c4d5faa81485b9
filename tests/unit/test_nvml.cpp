// NVLink as NVML reports it (src/gpu/nvml.cpp), against tests/support/fakenvml, which
// describes the GPUs and NVLink pairs the FAKENVML_* variables lay out (read at each
// nvmlInit_v2): a DGX-like host with NVSwitch, GPUs joined in pairs by bridges, a PCIe-only
// host, a GPU NVML may not open, NVML failing to start, and no NVML at all.
#include "gpu/nvml.hpp"
#include "gpu/runtime.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

using braid::gpu::describe_nvlink;
using braid::gpu::query_nvlink;
using braid::gpu::sysfs_pci_address;

namespace {

struct Env {
  Env(const char* gpus, const char* links, const char* nvlink) {
    ::setenv("FAKENVML_GPUS", gpus, 1);
    ::setenv("FAKENVML_LINKS", links, 1);
    ::setenv("FAKENVML_NVLINK", nvlink, 1);
    ::unsetenv("FAKENVML_INIT");
    ::unsetenv("FAKENVML_NO_ACCESS");
  }
};

constexpr const char* kFour = "00000000:1B:00.0,00000000:43:00.0,00000000:52:00.0,00000000:61:00.0";

}  // namespace

TEST(Nvml, BusIdsAreWrittenAsSysfsWritesThem) {
  EXPECT_EQ(sysfs_pci_address("00000000:1B:00.0"), "0000:1b:00.0");
  EXPECT_EQ(sysfs_pci_address("0000:1B:00.0"), "0000:1b:00.0");
  EXPECT_EQ(sysfs_pci_address("00000001:1B:00.0"), "0001:1b:00.0");
  EXPECT_EQ(sysfs_pci_address("00010000:1B:00.0"), "10000:1b:00.0") << "a domain beyond 16 bits (VMD), as sysfs's %04x";
}

TEST(Nvml, EveryPairThroughNvswitch) {
  Env e(kFour, "18", "all");
  const auto r = query_nvlink(BRAID_FAKENVML_LIBRARY);
  ASSERT_TRUE(r.loaded) << r.why;
  ASSERT_EQ(r.gpus.size(), 4u);
  EXPECT_EQ(r.gpus[0].pci_bus_id, "0000:1b:00.0");
  EXPECT_EQ(r.gpus[3].active_links, 18);
  EXPECT_EQ(r.nvlink_pairs.size(), 6u);
  EXPECT_TRUE(r.nvlink_between("0000:43:00.0", "0000:1b:00.0"));
  EXPECT_FALSE(r.nvlink_between("0000:43:00.0", "0000:43:00.0")) << "a GPU is not its own NVLink peer";
  EXPECT_FALSE(r.nvlink_between("0000:43:00.0", "0000:99:00.0")) << "an unknown GPU";
  const std::string d = describe_nvlink(r, "  ");
  EXPECT_NE(d.find("4 GPU(s)"), std::string::npos) << d;
  EXPECT_NE(d.find("GPU 0000:61:00.0: 18 NVLink link(s) active"), std::string::npos) << d;
  EXPECT_NE(d.find("joined by NVLink: every pair"), std::string::npos) << d;
}

TEST(Nvml, BridgedPairsOnly) {
  Env e(kFour, "4,4,4,4", "0-1,3-2");
  const auto r = query_nvlink(BRAID_FAKENVML_LIBRARY);
  ASSERT_TRUE(r.loaded) << r.why;
  EXPECT_TRUE(r.nvlink_between("0000:1b:00.0", "0000:43:00.0"));
  EXPECT_TRUE(r.nvlink_between("0000:61:00.0", "0000:52:00.0"));
  EXPECT_FALSE(r.nvlink_between("0000:1b:00.0", "0000:52:00.0"));
  const std::string d = describe_nvlink(r, "");
  EXPECT_NE(d.find("0000:1b:00.0<->0000:43:00.0 0000:52:00.0<->0000:61:00.0"), std::string::npos) << d;
}

TEST(Nvml, PcieOnlyHost) {
  Env e("00000000:3B:00.0,00000000:86:00.0", "0", "none");
  const auto r = query_nvlink(BRAID_FAKENVML_LIBRARY);
  ASSERT_TRUE(r.loaded) << r.why;
  EXPECT_EQ(r.gpus[0].active_links, 0) << "links NVML does not support count as none";
  EXPECT_TRUE(r.nvlink_pairs.empty());
  EXPECT_NE(describe_nvlink(r, "").find("no pair (PCIe only)"), std::string::npos);
}

TEST(Nvml, AGpuNvmlMayNotOpenIsLeftOutAndNamed) {
  Env e(kFour, "18", "all");
  ::setenv("FAKENVML_NO_ACCESS", "1", 1);
  const auto r = query_nvlink(BRAID_FAKENVML_LIBRARY);
  ::unsetenv("FAKENVML_NO_ACCESS");
  ASSERT_TRUE(r.loaded) << r.why;
  EXPECT_EQ(r.gpus.size(), 3u);
  EXPECT_EQ(r.nvlink_pairs.size(), 3u);
  EXPECT_NE(r.why.find("GPU index 1"), std::string::npos) << r.why;
  EXPECT_NE(r.why.find("Insufficient Permissions"), std::string::npos) << r.why;
  EXPECT_NE(describe_nvlink(r, "").find("left out: GPU index 1"), std::string::npos);
}

TEST(Nvml, NvmlThatCannotStartSaysWhy) {
  Env e(kFour, "18", "all");
  ::setenv("FAKENVML_INIT", "9", 1);  // NVML_ERROR_DRIVER_NOT_LOADED
  const auto r = query_nvlink(BRAID_FAKENVML_LIBRARY);
  ::unsetenv("FAKENVML_INIT");
  EXPECT_FALSE(r.loaded);
  EXPECT_NE(r.why.find("nvmlInit_v2: Driver Not Loaded (9)"), std::string::npos) << r.why;
  EXPECT_NE(describe_nvlink(r, "").find("NVLink: unknown (NVML: nvmlInit_v2"), std::string::npos);
}

TEST(Nvml, NoNvmlOrNotNvmlSaysWhy) {
  auto r = query_nvlink("/nonexistent/libnvidia-ml.so.1");
  EXPECT_FALSE(r.loaded);
  EXPECT_NE(r.why.find("cannot load /nonexistent/libnvidia-ml.so.1"), std::string::npos) << r.why;
  EXPECT_NE(r.why.find("BRAID_NVML_LIBRARY"), std::string::npos) << r.why;
  r = query_nvlink("libm.so.6");  // loads, but is not NVML
  EXPECT_FALSE(r.loaded);
  EXPECT_NE(r.why.find("has no nvmlInit_v2"), std::string::npos) << r.why;
}
