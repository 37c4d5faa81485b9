// The device runtime's GPUDirect RDMA primitives (src/gpu/runtime.hpp): dma-buf export of
// device memory and the flush of NIC writes, on the host emulation (a fresh Emulated per
// test, not the process's runtime) and the backend without a device; on the CUDA backend
// where this host has a GPU (skipped otherwise, with the reason).
//
// What is checked:
// * the emulated export is a file whose own mapping aliases the device allocation, both
//   ways, covering the whole allocation page-aligned; ranges past the allocation and host
//   memory are refused with InvalidUsage;
// * freeing device memory closes its file (500 allocations leak no descriptor), and memfd
//   backing leaves classify() as it was;
// * flush_rdma_writes() counts; dmabuf_support() says "" for a device that has it, why
//   not otherwise; the backend without a device refuses with its reason.
#include "gpu/runtime.hpp"

#include <braid/error.hpp>
#include <gtest/gtest.h>

#include <cstdlib>

#include <dirent.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

using namespace braid;

namespace {

/// Entries of /proc/self/fd (the directory's own descriptor included, the same each time).
int open_fds() {
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  while (const dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n;
}

template <typename Fn>
ErrorCode code_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.code();
  }
  ADD_FAILURE() << "no braid::Error thrown";
  return ErrorCode::Internal;
}

}  // namespace

TEST(EmulatedDmabuf, TheExportAliasesTheDeviceAllocation) {
  auto rt = gpu::make_emulated();
  const std::size_t bytes = 10000;  // not a whole number of pages
  auto* dev = static_cast<unsigned char*>(rt->alloc_device(bytes, 1));
  std::memset(dev, 0, bytes);

  std::uintptr_t base = 0;
  std::size_t size = 0;
  const int fd = rt->export_dmabuf(dev + 100, 200, &base, &size);
  ASSERT_GE(fd, 0);
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  EXPECT_EQ(base, reinterpret_cast<std::uintptr_t>(dev)) << "offset 0 of the fd is the allocation's start";
  EXPECT_EQ(base % page, 0u);
  EXPECT_EQ(size % page, 0u);
  EXPECT_GE(size, bytes) << "the fd covers the whole allocation";
  EXPECT_LT(size, bytes + page);

  // A second mapping of the fd, as the test verbs provider makes: the same pages.
  void* m = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(m, MAP_FAILED) << std::strerror(errno);
  auto* nic = static_cast<unsigned char*>(m);
  EXPECT_NE(nic, dev);
  nic[0] = 0x5a;
  nic[bytes - 1] = 0xa5;
  EXPECT_EQ(dev[0], 0x5a) << "a write through the fd's mapping is seen through the device pointer";
  EXPECT_EQ(dev[bytes - 1], 0xa5);
  dev[4321] = 0x77;
  EXPECT_EQ(nic[4321], 0x77) << "and the reverse";
  ASSERT_EQ(::munmap(m, size), 0);
  EXPECT_EQ(::close(fd), 0) << "the caller owns the fd";

  // Whole allocation; an empty range inside it; the last byte.
  int f = rt->export_dmabuf(dev, bytes, nullptr, nullptr);
  EXPECT_GE(f, 0);
  ::close(f);
  f = rt->export_dmabuf(dev + bytes - 1, 1, &base, &size);
  EXPECT_GE(f, 0);
  EXPECT_EQ(base, reinterpret_cast<std::uintptr_t>(dev));
  ::close(f);

  // A page-aligned registration of a buffer at the allocation's end reaches its last page's
  // end: exportable. Past the pages: refused.
  const std::size_t mapped = (bytes + page - 1) / page * page;
  f = rt->export_dmabuf(dev + mapped - page, page, &base, &size);
  EXPECT_GE(f, 0);
  ::close(f);
  EXPECT_EQ(code_of([&] { rt->export_dmabuf(dev + 100, mapped, &base, &size); }), ErrorCode::InvalidUsage);
  EXPECT_EQ(code_of([&] { rt->export_dmabuf(dev + bytes, 1, &base, &size); }), ErrorCode::InvalidUsage)
      << "one past the end is not the allocation";
  try {
    rt->export_dmabuf(dev, mapped + 1, &base, &size);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
    EXPECT_NE(std::string(e.what()).find("10000 bytes"), std::string::npos) << e.what();
  }

  // Host memory (pageable and pinned) is no device allocation.
  std::vector<unsigned char> host(4096);
  EXPECT_EQ(code_of([&] { rt->export_dmabuf(host.data(), 16, &base, &size); }), ErrorCode::InvalidUsage);
  void* pinned = rt->alloc_pinned(4096);
  EXPECT_EQ(code_of([&] { rt->export_dmabuf(pinned, 16, &base, &size); }), ErrorCode::InvalidUsage);
  rt->free_pinned(pinned);

  rt->free_device(dev);
  EXPECT_EQ(code_of([&] { rt->export_dmabuf(dev, 1, &base, &size); }), ErrorCode::InvalidUsage)
      << "freed memory is no device memory";
}

TEST(EmulatedDmabuf, ClassifyIsUnchangedByTheFileBacking) {
  auto rt = gpu::make_emulated();
  auto* a = static_cast<unsigned char*>(rt->alloc_device(100, 0));
  auto* z = static_cast<unsigned char*>(rt->alloc_device(0, 1));
  EXPECT_EQ(rt->classify(a).kind, MemoryKind::device);
  EXPECT_EQ(rt->classify(a).device, 0);
  EXPECT_EQ(rt->classify(a + 99).kind, MemoryKind::device);
  EXPECT_EQ(rt->classify(a + 100).kind, MemoryKind::host) << "the requested size bounds the range, not the page";
  EXPECT_EQ(rt->classify(z).kind, MemoryKind::device) << "a 0-byte allocation holds its first byte";
  EXPECT_EQ(rt->classify(z).device, 1);
  EXPECT_EQ(rt->classify(z + 1).kind, MemoryKind::host);
  rt->copy(a, "0123456789", 10);
  EXPECT_EQ(std::memcmp(a, "0123456789", 10), 0);
  rt->free_device(a);
  rt->free_device(z);
  EXPECT_EQ(rt->classify(a).kind, MemoryKind::host);
  rt->free_device(nullptr);
}

TEST(EmulatedDmabuf, FreeingDeviceMemoryClosesItsFile) {
  auto rt = gpu::make_emulated();
  const int before = open_fds();
  ASSERT_GT(before, 0);
  for (int i = 0; i < 500; ++i) {
    void* p = rt->alloc_device(static_cast<std::size_t>(i) * 37, i % 2);
    static_cast<unsigned char*>(p)[0] = static_cast<unsigned char>(i);
    if (i % 50 == 0) ::close(rt->export_dmabuf(p, 1, nullptr, nullptr));
    rt->free_device(p);
  }
  // Held all at once too: one descriptor each while they live, none after.
  std::vector<void*> held;
  for (int i = 0; i < 100; ++i) held.push_back(rt->alloc_device(4096, 0));
  EXPECT_EQ(open_fds(), before + 100);
  for (void* p : held) rt->free_device(p);
  EXPECT_EQ(open_fds(), before);
}

TEST(EmulatedDmabuf, FlushesCount) {
  auto rt = gpu::make_emulated();
  EXPECT_EQ(rt->rdma_flushes(), 0u);
  rt->flush_rdma_writes();
  rt->flush_rdma_writes();
  EXPECT_EQ(rt->rdma_flushes(), 2u);
}

TEST(EmulatedDmabuf, SupportOnItsDevicesOnly) {
  auto rt = gpu::make_emulated();
  EXPECT_EQ(rt->dmabuf_support(0), "");
  EXPECT_EQ(rt->dmabuf_support(1), "");
  const std::string why = rt->dmabuf_support(rt->device_count());
  EXPECT_NE(why.find("does not exist"), std::string::npos) << why;
  EXPECT_FALSE(rt->dmabuf_support(-1).empty());
}

TEST(NoDeviceDmabuf, RefusedWithTheReason) {
  auto rt = gpu::make_none("no GPU in this test");
  const std::string why = rt->dmabuf_support(0);
  EXPECT_NE(why.find("no GPU in this test"), std::string::npos) << why;
  int x = 0;
  std::uintptr_t base = 0;
  std::size_t size = 0;
  EXPECT_EQ(code_of([&] { rt->export_dmabuf(&x, sizeof x, &base, &size); }), ErrorCode::Unsupported);
  try {
    rt->flush_rdma_writes();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Unsupported);
    EXPECT_NE(std::string(e.what()).find("no GPU in this test"), std::string::npos) << e.what();
  }
  EXPECT_EQ(rt->rdma_flushes(), 0u) << "a refused flush did not run";
}

// On a host with a GPU (scripts/gpu_check.sh): the export of a cudaMalloc allocation is a
// page-aligned range holding it, or refused as Unsupported with dmabuf_support()'s reason;
// a flush runs and counts. Elsewhere: skipped with make_cuda()'s reason.
TEST(CudaDmabuf, ExportOrItsReason) {
  std::string why;
  auto rt = gpu::make_cuda(&why);
  // scripts/gpu_check.sh sets BRAID_TEST_REQUIRE_GPU=1: there, no GPU is a failure.
  const char* require = std::getenv("BRAID_TEST_REQUIRE_GPU");
  if (!rt && require != nullptr && std::string(require) == "1") FAIL() << "BRAID_TEST_REQUIRE_GPU=1: " << why;
  if (!rt) GTEST_SKIP() << why;
  void* dev = rt->alloc_device(10000, 0);
  std::uintptr_t base = 0;
  std::size_t size = 0;
  const std::string support = rt->dmabuf_support(0);
  std::cout << "dmabuf_support(0): \"" << support << "\"\n";
  EXPECT_FALSE(rt->dmabuf_support(rt->device_count()).empty());
  if (support.empty()) {
    const int fd = rt->export_dmabuf(static_cast<char*>(dev) + 64, 128, &base, &size);
    EXPECT_GE(fd, 0);
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    EXPECT_EQ(base % page, 0u);
    EXPECT_EQ(size % page, 0u);
    EXPECT_LE(base, reinterpret_cast<std::uintptr_t>(dev));
    EXPECT_GE(base + size, reinterpret_cast<std::uintptr_t>(dev) + 10000);
    if (fd >= 0) ::close(fd);
    EXPECT_EQ(code_of([&] { rt->export_dmabuf(dev, 20000000, &base, &size); }), ErrorCode::InvalidUsage);
  } else {
    EXPECT_EQ(code_of([&] { rt->export_dmabuf(dev, 128, &base, &size); }), ErrorCode::Unsupported);
  }
  int host = 0;
  EXPECT_EQ(code_of([&] { rt->export_dmabuf(&host, sizeof host, &base, &size); }), ErrorCode::InvalidUsage);
  try {
    rt->flush_rdma_writes();
    EXPECT_EQ(rt->rdma_flushes(), 1u);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Unsupported) << e.what();
    std::cout << "flush_rdma_writes: " << e.what() << "\n";
  }
  rt->free_device(dev);
}
