// The host's NICs and PCI distances (core/host_hardware.hpp), read from a fake sysfs tree
// built as the kernel lays it out, and once from the real /sys.
#include "core/host_hardware.hpp"

#include "test_support.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

using namespace braid::core;
namespace fs = std::filesystem;

namespace {

// A DGX-like PCI tree:
//   host bridge pci0000:00 (NUMA 0)
//     root port 00:01.0 -> switch upstream 01:00.0
//       downstream 02:01.0 -> GPU   03:00.0
//       downstream 02:02.0 -> NIC A 04:00.0 (mlx5_0)      : PIX from the GPU
//       downstream 02:03.0 -> switch 06:00.0 -> 07:01.0 -> NIC D 08:00.0 : PXB
//     root port 00:02.0 -> NIC B 05:00.0 (a virtio NIC below it)          : PHB
//   host bridge pci0000:80 (NUMA 1)
//     root port 80:01.0 -> NIC C 81:00.0                                  : SYS
class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    root = braid::test::temp_path("sysfs");
    device("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:03:00.0", 0);
    device("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:04:00.0", 0);
    device("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:03.0/0000:06:00.0/0000:07:01.0/0000:08:00.0", 0);
    device("pci0000:00/0000:00:02.0/0000:05:00.0", 0);
    device("pci0000:80/0000:80:01.0/0000:81:00.0", 1);
    fs::create_directories(root + "/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:04:00.0/infiniband/mlx5_0");
    fs::create_directories(root + "/devices/pci0000:00/0000:00:02.0/0000:05:00.0/virtio0");
    nic("ibp4s0", "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:04:00.0", "up", "400000");
    nic("eth0", "pci0000:00/0000:00:02.0/0000:05:00.0/virtio0", "up", "");
    nic("enp129s0", "pci0000:80/0000:80:01.0/0000:81:00.0", "down", "-1");
    nic("veth0", "", "up", "10000");
    nic("lo", "", "unknown", "");
  }
  void TearDown() override { fs::remove_all(root); }

  void write(const std::string& path, const std::string& text) {
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path) << text << "\n";
  }
  // A PCI device at `chain` below devices/, with its bus/pci/devices link and NUMA node.
  void device(const std::string& chain, int numa) {
    const std::string dir = root + "/devices/" + chain;
    fs::create_directories(dir);
    write(dir + "/numa_node", std::to_string(numa));
    const std::string addr = fs::path(chain).filename();
    fs::create_directories(root + "/bus/pci/devices");
    fs::create_symlink("../../../devices/" + chain, root + "/bus/pci/devices/" + addr);
  }
  void nic(const std::string& name, const std::string& dev, const std::string& state, const std::string& speed) {
    const std::string dir = root + "/class/net/" + name;
    fs::create_directories(dir);
    write(dir + "/operstate", state);
    if (!speed.empty()) write(dir + "/speed", speed);
    if (!dev.empty()) fs::create_symlink("../../../devices/" + dev, dir + "/device");
  }

  std::string root;
};

TEST_F(FakeSysfs, NicsCarryTheirPciFunctionNumaNodeSpeedAndRdmaDevices) {
  const auto nics = host_nics(root);
  ASSERT_EQ(nics.size(), 4u);  // loopback left out; sorted by name
  EXPECT_EQ(nics[0].name, "enp129s0");
  EXPECT_EQ(nics[0].pci, "0000:81:00.0");
  EXPECT_EQ(nics[0].numa_node, 1);
  EXPECT_EQ(nics[0].speed_mbps, -1);  // down: the kernel reports -1
  EXPECT_EQ(nics[0].state, "down");
  EXPECT_EQ(nics[1].name, "eth0");
  EXPECT_EQ(nics[1].pci, "0000:05:00.0");  // the PCI function above virtio0
  EXPECT_EQ(nics[1].speed_mbps, -1);        // no speed file
  EXPECT_EQ(nics[2].name, "ibp4s0");
  EXPECT_EQ(nics[2].pci, "0000:04:00.0");
  EXPECT_EQ(nics[2].numa_node, 0);
  EXPECT_EQ(nics[2].speed_mbps, 400000);
  EXPECT_EQ(nics[2].rdma, std::vector<std::string>{"mlx5_0"});
  EXPECT_EQ(nics[3].name, "veth0");
  EXPECT_TRUE(nics[3].pci.empty());
  EXPECT_EQ(nics[3].numa_node, -1);
}

TEST_F(FakeSysfs, DistancesFollowThePciTreeAsNcclNamesThem) {
  const std::string gpu = "0000:03:00.0";
  EXPECT_EQ(pci_distance(gpu, gpu, root), PciDistance::same);
  EXPECT_EQ(pci_distance(gpu, "0000:04:00.0", root), PciDistance::pix);
  EXPECT_EQ(pci_distance(gpu, "0000:08:00.0", root), PciDistance::pxb);
  EXPECT_EQ(pci_distance(gpu, "0000:05:00.0", root), PciDistance::phb);
  EXPECT_EQ(pci_distance(gpu, "0000:81:00.0", root), PciDistance::sys);
  EXPECT_EQ(pci_distance(gpu, "0000:99:00.0", root), PciDistance::unknown);
  // CUDA's spelling (8-digit domain, upper case) names the same device.
  EXPECT_EQ(pci_distance("00000000:03:00.0", "0000:04:00.0", root), PciDistance::pix);
  EXPECT_EQ(pci_distance("0000:04:00.0", gpu, root), PciDistance::pix);  // symmetric
}

TEST_F(FakeSysfs, TheDescriptionNamesEachNicAndItsDistanceFromTheGpu) {
  const std::string text = describe_host_hardware("0000:03:00.0", "  ", root);
  EXPECT_NE(text.find("NIC ibp4s0: PCI 0000:04:00.0, NUMA node 0, 400000 Mb/s, up, RDMA mlx5_0; from GPU "
                      "0000:03:00.0: PIX"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("NIC enp129s0: PCI 0000:81:00.0, NUMA node 1, down; from GPU 0000:03:00.0: SYS"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("NIC veth0: virtual, 10000 Mb/s, up\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("NIC lo"), std::string::npos) << text;
  // Without a GPU, no distances.
  EXPECT_EQ(describe_host_hardware("", "", root).find("from GPU"), std::string::npos);
}

TEST(PciAddress, NormalizedAsSysfsWritesIt) {
  EXPECT_EQ(normalize_pci_address("00000000:1B:00.0"), "0000:1b:00.0");
  EXPECT_EQ(normalize_pci_address("0000:1b:00.0"), "0000:1b:00.0");
}

TEST(HostHardware, TheRealSysfsIsReadWithoutLoopback) {
  const auto nics = host_nics();
  for (const auto& n : nics) EXPECT_NE(n.name, "lo");
  EXPECT_NE(describe_host_hardware("", "").find("NIC"), std::string::npos);
}

}  // namespace
