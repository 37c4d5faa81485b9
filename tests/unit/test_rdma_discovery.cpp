// RDMA device discovery (src/transport/ibverbs): libibverbs loaded at run time, the
// device list, the sysfs readers against a fake tree, the text braid_info prints, and
// BRAID_IBVERBS_LIBRARY reaching the loader. No RDMA device exists on the machines these
// tests run on, so the port/GID queries against real hardware are not exercised here.
#include "transport/ibverbs/ibv_discovery.hpp"

#include <braid/config.hpp>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace ib = braid::transport::ibverbs;
namespace fs = std::filesystem;

namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

void write_file(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

/// A fake sysfs: two devices, one on NUMA node 1 behind a PCI path, one without affinity;
/// GID types as the kernel writes them, plus an unreadable entry (a directory, as
/// unreadable to a root test as a mode-000 file is not) and one with unexpected text.
class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/braid_sysfs_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    const fs::path pci = root_ / "devices/pci0000:00/0000:00:02.0/0000:03:00.0";
    write_file(pci / "numa_node", "1\n");
    const fs::path dev = root_ / "class/infiniband/mlx5_0";
    fs::create_directories(dev);
    // As in sysfs: device -> ../../../devices/pci…
    fs::create_directory_symlink("../../../devices/pci0000:00/0000:00:02.0/0000:03:00.0", dev / "device");
    const fs::path types = dev / "ports/1/gid_attrs/types";
    write_file(types / "0", "IB/RoCE v1\n");
    write_file(types / "1", "RoCE v2\n");
    fs::create_directories(types / "2");  // unreadable as a file
    write_file(types / "3", "RoCE v3\n");
    write_file(root_ / "class/infiniband/mlx5_1/device/numa_node", "-1\n");
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path root_;
};

}  // namespace

TEST_F(FakeSysfs, NumaNodeIsReadOrMinusOne) {
  EXPECT_EQ(ib::read_numa_node(root_, "mlx5_0"), 1);
  EXPECT_EQ(ib::read_numa_node(root_, "mlx5_1"), -1) << "the kernel writes -1 for no affinity";
  EXPECT_EQ(ib::read_numa_node(root_, "mlx5_9"), -1) << "no such device";
  write_file(root_ / "class/infiniband/mlx5_1/device/numa_node", "x1\n");
  EXPECT_EQ(ib::read_numa_node(root_, "mlx5_1"), -1) << "garbage is unknown, not 0";
}

TEST_F(FakeSysfs, PciPathIsTheResolvedDeviceLink) {
  char real_root[PATH_MAX];
  ASSERT_NE(::realpath(root_.c_str(), real_root), nullptr);
  EXPECT_EQ(ib::read_pci_path(root_, "mlx5_0"),
            std::string(real_root) + "/devices/pci0000:00/0000:00:02.0/0000:03:00.0");
  EXPECT_EQ(ib::read_pci_path(root_, "mlx5_9"), "") << "no such device";
}

TEST_F(FakeSysfs, GidTypesAsTheKernelWritesThem) {
  EXPECT_EQ(ib::read_gid_type(root_, "mlx5_0", 1, 0, true), ib::GidType::roce_v1);
  EXPECT_EQ(ib::read_gid_type(root_, "mlx5_0", 1, 0, false), ib::GidType::ib) << "IB/RoCE v1 on an IB port";
  EXPECT_EQ(ib::read_gid_type(root_, "mlx5_0", 1, 1, true), ib::GidType::roce_v2);
  EXPECT_EQ(ib::read_gid_type(root_, "mlx5_0", 1, 2, true), ib::GidType::unknown) << "unreadable";
  EXPECT_EQ(ib::read_gid_type(root_, "mlx5_0", 1, 3, true), ib::GidType::unknown) << "unrecognised text";
  EXPECT_EQ(ib::read_gid_type(root_, "mlx5_0", 1, 4, true), ib::GidType::unknown) << "missing";
  EXPECT_EQ(ib::read_gid_type(root_, "mlx5_0", 2, 0, true), ib::GidType::unknown) << "no such port";
  EXPECT_STREQ(ib::to_string(ib::GidType::roce_v2), "RoCE v2");
  EXPECT_STREQ(ib::to_string(ib::GidType::unknown), "unknown");
}

#if BRAID_HAVE_IBVERBS
TEST(RdmaDiscovery, AMissingLibraryIsAReasonWithTheFix) {
  const ib::Discovery d = ib::discover("/nonexistent/libibverbs.so.1");
  EXPECT_FALSE(d.loaded);
  EXPECT_TRUE(d.devices.empty());
  EXPECT_TRUE(has(d.why, "cannot load /nonexistent/libibverbs.so.1")) << d.why;
  EXPECT_TRUE(has(d.why, "BRAID_IBVERBS_LIBRARY")) << d.why;
  EXPECT_EQ(ib::summary(d).rfind("unknown: cannot load", 0), 0u) << ib::summary(d);
  EXPECT_EQ(ib::describe(d).front().rfind("unknown: cannot load", 0), 0u);
}

TEST(RdmaDiscovery, ALibraryThatIsNotLibibverbsIsRefusedNamingTheEntryPoint) {
  const ib::Discovery d = ib::discover("libm.so.6");
  EXPECT_FALSE(d.loaded);
  EXPECT_TRUE(has(d.why, "libm.so.6 has no ibv_get_device_list")) << d.why;
}

TEST(RdmaDiscovery, TheRealLibraryListsWhatSysfsHas) {
  const ib::Discovery d = ib::discover("");
  if (has(d.why, "cannot load libibverbs.so.1")) GTEST_SKIP() << "libibverbs is not installed here: " << d.why;
  ASSERT_TRUE(d.loaded) << d.why;
  EXPECT_TRUE(has(d.library, "libibverbs.so.1")) << d.library;
  // The kernel's list is the reference: these machines have no /sys/class/infiniband, so
  // libibverbs must list nothing and say so; a host with devices must list every one.
  std::size_t in_sysfs = 0;
  std::error_code ec;
  for (auto it = fs::directory_iterator("/sys/class/infiniband", ec); !ec && it != fs::directory_iterator(); ++it)
    ++in_sysfs;
  EXPECT_EQ(d.devices.size(), in_sysfs) << ib::summary(d);
  if (in_sysfs == 0) {
    EXPECT_EQ(ib::summary(d).rfind("none (libibverbs.so.1", 0), 0u) << ib::summary(d);
    const auto lines = ib::describe(d);
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_EQ(lines[0], "libibverbs: " + d.library);
    EXPECT_EQ(lines[1].rfind("none: ", 0), 0u) << lines[1];
  }
  for (const auto& dev : d.devices) {
    EXPECT_FALSE(dev.name.empty());
    EXPECT_TRUE(fs::exists("/sys/class/infiniband/" + dev.name)) << dev.name;
  }
}

TEST(RdmaDiscovery, BraidIbverbsLibraryReachesTheLoader) {
  // braid_info's feature line goes through the configuration table's row.
  const std::string exe = std::string(BRAID_BINARY_DIR) + "/tools/braid_info";
  if (::access(exe.c_str(), X_OK) != 0) GTEST_SKIP() << "braid_info is not built (BRAID_BUILD_TOOLS=OFF)";
  FILE* p = ::popen(("BRAID_IBVERBS_LIBRARY=/nonexistent/libibverbs.so.1 " + exe).c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  EXPECT_EQ(::pclose(p), 0) << out;
  EXPECT_TRUE(has(out, "the ibverbs transport, hardware-untested): unknown: cannot load "
                       "/nonexistent/libibverbs.so.1"))
      << out;
}
#else
TEST(RdmaDiscovery, WithoutHeadersDiscoverySaysSo) {
  const ib::Discovery d = ib::discover("");
  EXPECT_FALSE(d.loaded);
  EXPECT_TRUE(has(d.why, "not built with verbs headers")) << d.why;
}
#endif

TEST(RdmaDiscovery, TextOfAHostWithDevices) {
  // What braid_info prints for a RoCE NIC, built by hand (no device here to list).
  ib::Discovery d;
  d.loaded = true;
  d.library = "/usr/lib/libibverbs.so.1.14.44.0";
  ib::Device dev;
  dev.name = "mlx5_0";
  dev.firmware = "20.31.1014";
  dev.numa_node = 1;
  dev.pci_path = "/sys/devices/pci0000:00/0000:00:02.0/0000:03:00.0";
  ib::Port port;
  port.number = 1;
  port.state = "ACTIVE";
  port.link_layer = "Ethernet";
  port.active_mtu = 4096;
  port.gids = {{0, "fe80::1", ib::GidType::roce_v1}, {3, "::ffff:10.0.0.1", ib::GidType::roce_v2}};
  dev.ports.push_back(port);
  ib::Device down;
  down.name = "mlx5_1";
  down.error = "ibv_open_device: Permission denied (permissions on /dev/infiniband?)";
  d.devices = {dev, down};
  EXPECT_EQ(ib::summary(d),
            "mlx5_0 port 1 ACTIVE Ethernet MTU 4096 (NUMA 1), mlx5_1 (ibv_open_device: Permission denied "
            "(permissions on /dev/infiniband?))");
  const auto lines = ib::describe(d);
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_EQ(lines[0], "libibverbs: /usr/lib/libibverbs.so.1.14.44.0");
  EXPECT_EQ(lines[1],
            "mlx5_0: firmware 20.31.1014, NUMA node 1, PCI /sys/devices/pci0000:00/0000:00:02.0/0000:03:00.0");
  EXPECT_EQ(lines[2], "  port 1: ACTIVE, Ethernet, active MTU 4096, 2 GIDs");
  EXPECT_EQ(lines[3], "    GID 0: fe80::1 (RoCE v1)");
  EXPECT_EQ(lines[4], "    GID 3: ::ffff:10.0.0.1 (RoCE v2)");
  EXPECT_EQ(lines[5], "mlx5_1: NUMA node unknown, PCI unknown; ibv_open_device: Permission denied (permissions on "
                      "/dev/infiniband?)");
}
