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
// * IPC (ipc_export/ipc_open/ipc_close): a forked child, with its own emulated runtime, maps
//   its parent's allocation from the handle (bytes and fd, inherited), sees it as device
//   memory of the parent's device, and its writes are what the parent's pointer reads; a
//   handle of this process, a malformed one, one whose fd is missing or too short, and an
//   export of a pointer that is not an allocation's start are refused with InvalidUsage;
//   the fd of the handle is closed whatever ipc_open does, and 200 rounds leak none. On a
//   GPU: the same across a re-executed child process with CUDA IPC.
// * the emulation of a GPU's hazards: with 1 hardware queue a stream wait blocks another
//   stream's copy (the default stream's wait too) and signal() releases both, with 2 it
//   does not, and streams map round-robin; write_value releases a wait on another stream,
//   except behind it on the same queue; waits compare cyclically (>=); an event orders two
//   streams by the generation recorded before the wait; host functions run on one thread
//   and the stream waits for them; free_device waits for its device while holding the
//   driver lock (another thread's runtime call blocks: the deadlock, released by a host
//   store); the counts; sticky errors, global-mode capture and contexts per device.
#include "gpu/runtime.hpp"

#include <braid/error.hpp>
#include <gtest/gtest.h>

#include <cstdlib>

#include <dirent.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <future>
#include <iostream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
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

/// The message of the braid::Error fn throws ("" and a failure when none).
template <typename Fn>
std::string message_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no braid::Error thrown";
  return "";
}

bool fd_is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1 || errno != EBADF; }

/// Runs body in a forked child; returns what it returned ("" for success), or why the
/// child failed otherwise. The child has no GoogleTest of its own: it reports by string.
std::string in_child(const std::function<std::string()>& body) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return std::string("pipe2: ") + std::strerror(errno);
  const pid_t pid = ::fork();
  if (pid < 0) return std::string("fork: ") + std::strerror(errno);
  if (pid == 0) {
    ::close(pipe_fds[0]);
    std::string out;
    try {
      out = body();
    } catch (const std::exception& e) {
      out = std::string("child threw: ") + e.what();
    }
    const char* at = out.data();
    std::size_t left = out.size();
    while (left > 0) {
      const ssize_t n = ::write(pipe_fds[1], at, left);
      if (n <= 0) break;
      at += n;
      left -= static_cast<std::size_t>(n);
    }
    ::_exit(out.empty() ? 0 : 1);
  }
  ::close(pipe_fds[1]);
  std::string out;
  char buf[512];
  ssize_t n;
  while ((n = ::read(pipe_fds[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
    if (n > 0) out.append(buf, static_cast<std::size_t>(n));
  ::close(pipe_fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status)) return "the child did not exit (status " + std::to_string(status) + ") " + out;
  if (WEXITSTATUS(status) != 0 && out.empty()) return "the child exited " + std::to_string(WEXITSTATUS(status));
  return out;
}

/// "" when fn throws braid::Error(want) whose message holds `says`, else what happened.
template <typename Fn>
std::string refused(const char* what, ErrorCode want, const char* says, Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    if (e.code() != want) return std::string(what) + ": wrong error code: " + e.what() + "\n";
    if (std::string(e.what()).find(says) == std::string::npos)
      return std::string(what) + ": message lacks \"" + says + "\": " + e.what() + "\n";
    return "";
  }
  return std::string(what) + ": not refused\n";
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
  rt->flush_rdma_writes(0);
  rt->flush_rdma_writes(0);
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
    rt->flush_rdma_writes(0);
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
    // The range asked for, rounded out to the page (not the whole allocation).
    EXPECT_LE(base, reinterpret_cast<std::uintptr_t>(dev) + 64);
    EXPECT_GE(base + size, reinterpret_cast<std::uintptr_t>(dev) + 192);
    EXPECT_LE(size, 2 * page);
    if (fd >= 0) ::close(fd);
  } else {
    EXPECT_EQ(code_of([&] { rt->export_dmabuf(dev, 128, &base, &size); }), ErrorCode::Unsupported);
  }
  int host = 0;
  EXPECT_EQ(code_of([&] { rt->export_dmabuf(&host, sizeof host, &base, &size); }), ErrorCode::InvalidUsage);
  try {
    rt->flush_rdma_writes(0);
    EXPECT_EQ(rt->rdma_flushes(), 1u);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::Unsupported) << e.what();
    std::cout << "flush_rdma_writes: " << e.what() << "\n";
  }
  rt->free_device(dev);
}

// (a) A forked child, with a fresh emulated runtime of its own, maps the parent's allocation
// from the handle (its bytes and its fd, inherited across fork: CLOEXEC only acts on exec):
// device memory of the parent's device, whole allocation, and what it writes there, with
// plain stores and with a copy on its stream, is what the parent's pointer reads.
TEST(EmulatedIpc, AnotherProcessMapsTheAllocation) {
  auto rt = gpu::make_emulated();
  const std::size_t bytes = 10000;  // not a whole number of pages
  auto* dev = static_cast<unsigned char*>(rt->alloc_device(bytes, 1));
  std::memset(dev, 0, bytes);
  const gpu::IpcHandle h = rt->ipc_export(dev);
  ASSERT_GE(h.fd, 0);
  EXPECT_EQ(h.bytes.size(), 40u);
  EXPECT_EQ(h.bytes.compare(0, 6, "BEIPC1"), 0);
  EXPECT_NE(::fcntl(h.fd, F_GETFD) & FD_CLOEXEC, 0) << "the handle's fd is close-on-exec";

  const std::string child = in_child([&]() -> std::string {
    auto crt = gpu::make_emulated();  // a runtime of this process, which exported nothing
    const int fds = open_fds();
    auto* m = static_cast<unsigned char*>(crt->ipc_open(h, bytes));
    std::string why;
    if (fd_is_open(h.fd)) why += "ipc_open left the handle's fd open\n";
    if (open_fds() != fds - 1) why += "ipc_open holds a descriptor (the mapping holds the file)\n";
    if (m == dev) why += "the child's mapping is the inherited one, not a new one\n";
    const gpu::PointerInfo info = crt->classify(m);
    if (info.kind != MemoryKind::device || info.device != 1)
      why += "classify(mapping) is not device memory of device 1 (the exporter's)\n";
    if (crt->classify(m + bytes - 1).kind != MemoryKind::device) why += "the last byte is not device memory\n";
    if (crt->classify(m + bytes).kind != MemoryKind::host) why += "one past the allocation is device memory\n";
    for (std::size_t i = 0; i < bytes / 2; ++i) m[i] = static_cast<unsigned char>(i * 7 + 1);
    std::vector<unsigned char> tail(bytes - bytes / 2);
    for (std::size_t i = 0; i < tail.size(); ++i) tail[i] = static_cast<unsigned char>((bytes / 2 + i) * 7 + 1);
    crt->copy_async(m + bytes / 2, tail.data(), tail.size(), nullptr);  // a device copy, on a stream
    crt->synchronize(nullptr);
    crt->free_device(m);  // not its allocation: ignored
    if (crt->classify(m).kind != MemoryKind::device) why += "free_device dropped an opened mapping\n";
    m[0] = 1;             // still mapped
    crt->ipc_close(m);
    if (crt->classify(m).kind != MemoryKind::host) why += "after ipc_close the range is still device memory\n";
    if (open_fds() != fds - 1) why += "ipc_close changed the descriptor count\n";
    crt->ipc_close(m);  // again: unknown now, ignored
    return why;
  });
  EXPECT_EQ(child, "");
  ::close(h.fd);  // the parent's copy: the holder owns it
  for (std::size_t i = 0; i < bytes; ++i) {
    if (dev[i] != static_cast<unsigned char>(i * 7 + 1)) {
      ADD_FAILURE() << "byte " << i << " is " << int(dev[i]) << ": the child's write did not reach the parent";
      break;
    }
  }
  EXPECT_EQ(rt->classify(dev).kind, MemoryKind::device);
  rt->free_device(dev);
}

// (b) This process's own handle: refused (CUDA cannot open them), the fd closed all the same.
TEST(EmulatedIpc, ThisProcesssOwnHandleIsRefused) {
  auto rt = gpu::make_emulated();
  void* dev = rt->alloc_device(4096, 0);
  const int before = open_fds();
  gpu::IpcHandle h = rt->ipc_export(dev);
  EXPECT_EQ(open_fds(), before + 1);
  auto other = gpu::make_emulated();  // another runtime of this process: the same process
  try {
    other->ipc_open(h, 4096);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
    EXPECT_NE(std::string(e.what()).find("use the pointer itself"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fd_is_open(h.fd)) << "ipc_open takes over the fd, mapped or not";
  EXPECT_EQ(open_fds(), before);
  h = rt->ipc_export(dev);
  EXPECT_EQ(code_of([&] { rt->ipc_open(h, 1); }), ErrorCode::InvalidUsage) << "nor through the exporter's runtime";
  EXPECT_EQ(open_fds(), before);
  rt->ipc_close(dev);  // an own allocation is no ipc_open mapping: ignored
  EXPECT_EQ(rt->classify(dev).kind, MemoryKind::device);
  rt->free_device(dev);
}

// (c) Malformed handles, a missing or short fd, too many bytes asked for (in a child, so
// that the handle is another process's); exports of what is no allocation's start.
TEST(EmulatedIpc, MalformedHandlesAndExportsAreRefused) {
  auto rt = gpu::make_emulated();
  const std::size_t bytes = 3 * 4096 + 5;
  auto* dev = static_cast<unsigned char*>(rt->alloc_device(bytes, 0));
  const int before = open_fds();

  // Exports: only an allocation's start.
  EXPECT_NE(message_of([&] { rt->ipc_export(dev + 1); }).find("not at its start"), std::string::npos);
  EXPECT_EQ(code_of([&] { rt->ipc_export(dev + 1); }), ErrorCode::InvalidUsage);
  EXPECT_EQ(code_of([&] { rt->ipc_export(dev + bytes - 1); }), ErrorCode::InvalidUsage);
  EXPECT_EQ(code_of([&] { rt->ipc_export(dev + bytes); }), ErrorCode::InvalidUsage) << "one past the end";
  std::vector<unsigned char> host(64);
  EXPECT_NE(message_of([&] { rt->ipc_export(host.data()); }).find("not device memory"), std::string::npos);
  EXPECT_EQ(code_of([&] { rt->ipc_export(nullptr); }), ErrorCode::InvalidUsage);
  void* freed = rt->alloc_device(100, 1);
  rt->free_device(freed);
  EXPECT_EQ(code_of([&] { rt->ipc_export(freed); }), ErrorCode::InvalidUsage) << "freed memory";
  EXPECT_EQ(open_fds(), before) << "a refused export holds no descriptor";

  const gpu::IpcHandle h = rt->ipc_export(dev);
  const std::string child = in_child([&]() -> std::string {
    auto crt = gpu::make_emulated();
    std::string why;
    const auto with = [&](std::string b, int fd) { return gpu::IpcHandle{std::move(b), fd}; };
    const auto dup = [&] { return ::fcntl(h.fd, F_DUPFD_CLOEXEC, 0); };
    // Each refusal must close the fd it was given.
    const auto check = [&](const char* what, const char* says, gpu::IpcHandle bad, std::size_t n) {
      const int fd = bad.fd;
      why += refused(what, ErrorCode::InvalidUsage, says, [&] { crt->ipc_open(bad, n); });
      if (fd >= 0 && fd_is_open(fd)) why += std::string(what) + ": the fd was left open\n";
    };
    check("short bytes", "malformed", with(h.bytes.substr(0, 39), dup()), 1);
    check("long bytes", "malformed", with(h.bytes + "x", dup()), 1);
    check("empty bytes", "malformed", with("", dup()), 1);
    std::string magic = h.bytes;
    magic[5] = '2';
    check("wrong magic", "malformed", with(magic, dup()), 1);
    std::string device = h.bytes;
    device[6] = 7;
    check("no such device", "malformed", with(device, dup()), 1);
    std::string mapped = h.bytes;
    mapped[25] = static_cast<char>(mapped[25] + 1);  // +256 bytes: not a whole number of pages
    check("unaligned mapping", "malformed", with(mapped, dup()), 1);
    // No fd and a descriptor number the exporter does not hold: /proc has nothing to open.
    std::string gone = h.bytes;
    gone[32] = static_cast<char>(0x3f);
    gone[33] = static_cast<char>(0x42);
    gone[34] = static_cast<char>(0x0f);  // fd 999999
    check("no fd", "cannot be opened", with(gone, -1), 1);
    // No fd, the exporter's own number: opened through /proc/<pid>/fd (bytes-only handles).
    try {
      void* q = crt->ipc_open(with(h.bytes, -1), 1);
      if (crt->classify(q).kind != MemoryKind::device) return why + "bytes-only open: not device memory";
      crt->ipc_close(q);
    } catch (const std::exception& e) {
      return why + "bytes-only open refused: " + e.what();
    }
    check("too many bytes", "fewer than", with(h.bytes, dup()), bytes + 1);
    // A file shorter than the mapping the handle names: not the exporter's memfd.
    const int small = ::memfd_create("short", MFD_CLOEXEC);
    if (small < 0 || ::ftruncate(small, 4096) != 0) return why + "memfd_create: " + std::strerror(errno);
    check("short fd", "fewer than", with(h.bytes, small), bytes);
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return why + "pipe2: " + std::strerror(errno);
    ::close(pipe_fds[1]);
    check("a pipe", "fewer than", with(h.bytes, pipe_fds[0]), 1);
    // The handle itself still opens, for what it holds; the mapping is not exportable here.
    void* m = crt->ipc_open(h, bytes);
    why += refused("export of a mapping", ErrorCode::InvalidUsage, "ipc_open", [&] { crt->ipc_export(m); });
    why += refused("dma-buf of a mapping", ErrorCode::InvalidUsage, "ipc_open",
                   [&] { crt->export_dmabuf(m, 1, nullptr, nullptr); });
    crt->ipc_close(m);
    return why;
  });
  EXPECT_EQ(child, "");
  ::close(h.fd);
  EXPECT_EQ(open_fds(), before);
  rt->free_device(dev);
}

// (d) 200 rounds of export, open and close in a child, write, close: the parent's
// descriptors are as before, and the child's open and close left it none either.
TEST(EmulatedIpc, RoundsLeakNoDescriptor) {
  auto rt = gpu::make_emulated();
  const int before = open_fds();
  ASSERT_GT(before, 0);
  for (int i = 0; i < 200; ++i) {
    const std::size_t bytes = 64 + static_cast<std::size_t>(i) * 97;
    auto* dev = static_cast<unsigned char*>(rt->alloc_device(bytes, i % 2));
    const gpu::IpcHandle h = rt->ipc_export(dev);
    const std::string child = in_child([&]() -> std::string {
      auto crt = gpu::make_emulated();
      const int fds = open_fds();
      auto* m = static_cast<unsigned char*>(crt->ipc_open(h, bytes));
      m[bytes - 1] = static_cast<unsigned char>(i);
      crt->ipc_close(m);
      return open_fds() == fds - 1 ? "" : "the child holds " + std::to_string(open_fds() - fds + 1) + " descriptors";
    });
    ::close(h.fd);
    if (!child.empty() || dev[bytes - 1] != static_cast<unsigned char>(i)) {
      ADD_FAILURE() << "round " << i << ": " << child << " (last byte " << int(dev[bytes - 1]) << ")";
      rt->free_device(dev);
      break;
    }
    rt->free_device(dev);
  }
  EXPECT_EQ(open_fds(), before);
}

TEST(NoDeviceIpc, RefusedWithTheReason) {
  auto rt = gpu::make_none("no GPU in this test");
  int x = 0;
  const std::string why = message_of([&] { rt->ipc_export(&x); });
  EXPECT_NE(why.find("no GPU in this test"), std::string::npos) << why;
  EXPECT_EQ(code_of([&] { rt->ipc_export(&x); }), ErrorCode::Unsupported);
  const int fd = ::memfd_create("handle", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(code_of([&] { rt->ipc_open(gpu::IpcHandle{"anything", fd}, 1); }), ErrorCode::Unsupported);
  EXPECT_FALSE(fd_is_open(fd)) << "ipc_open takes over the fd even when it refuses";
  rt->ipc_close(&x);  // nothing to do
  rt->ipc_close(nullptr);
}

// On a host with a GPU: the export of a cudaMalloc allocation is 72 bytes and no fd, refused
// in this process and for a pointer inside the allocation; a child process (this test
// binary again, with CudaIpc.ChildSide only) opens it, checks it and writes through it, and
// this process reads what it wrote. Elsewhere: skipped with make_cuda()'s reason.
namespace {
constexpr const char* kIpcChildEnv = "BRAID_TEST_CUDA_IPC_CHILD";  // hex of the handle's bytes
constexpr std::size_t kCudaIpcBytes = std::size_t{2} << 20;
unsigned char cuda_pattern(std::size_t i) { return static_cast<unsigned char>(i * 13 + 5); }
}  // namespace

TEST(CudaIpc, AnotherProcessMapsTheAllocation) {
  std::string why;
  auto rt = gpu::make_cuda(&why);
  const char* require = std::getenv("BRAID_TEST_REQUIRE_GPU");
  if (!rt && require != nullptr && std::string(require) == "1") FAIL() << "BRAID_TEST_REQUIRE_GPU=1: " << why;
  if (!rt) GTEST_SKIP() << why;
  if (std::getenv(kIpcChildEnv) != nullptr) GTEST_SKIP() << "the child side runs CudaIpc.ChildSide only";
  auto* dev = static_cast<unsigned char*>(rt->alloc_device(kCudaIpcBytes, 0));
  std::vector<unsigned char> host(kCudaIpcBytes, 0);
  rt->copy(dev, host.data(), host.size());

  const gpu::IpcHandle h = rt->ipc_export(dev);
  EXPECT_EQ(h.bytes.size(), 72u) << "cudaIpcMemHandle_t and the pid";
  EXPECT_EQ(h.fd, -1);
  EXPECT_EQ(code_of([&] { rt->ipc_open(h, kCudaIpcBytes); }), ErrorCode::InvalidUsage) << "this process's own";
  EXPECT_EQ(code_of([&] { rt->ipc_open(gpu::IpcHandle{"short", -1}, 1); }), ErrorCode::InvalidUsage);
  EXPECT_EQ(code_of([&] { rt->ipc_export(dev + 256); }), ErrorCode::InvalidUsage) << "inside the allocation";
  int x = 0;
  EXPECT_EQ(code_of([&] { rt->ipc_export(&x); }), ErrorCode::InvalidUsage) << "host memory";

  static const char* hex = "0123456789abcdef";
  std::string env = std::string(kIpcChildEnv) + "=";
  for (unsigned char c : h.bytes) {
    env += hex[c >> 4];
    env += hex[c & 15];
  }
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) envs.emplace_back(*e);
  envs.push_back(env);
  std::vector<char*> envp;
  for (auto& e : envs) envp.push_back(&e[0]);
  envp.push_back(nullptr);
  std::string arg0 = "test_gpu_runtime", arg1 = "--gtest_filter=CudaIpc.ChildSide";
  char* argv[] = {&arg0[0], &arg1[0], nullptr};
  pid_t pid = -1;
  ASSERT_EQ(::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child process failed (status " << status
                                                              << "); its output is above";
  rt->copy(host.data(), dev, host.size());
  for (std::size_t i = 0; i < host.size(); ++i) {
    if (host[i] != cuda_pattern(i)) {
      ADD_FAILURE() << "byte " << i << " is " << int(host[i]) << ": the child's write did not reach this process";
      break;
    }
  }
  rt->free_device(dev);
}

// The child side of CudaIpc.AnotherProcessMapsTheAllocation (skipped when run on its own).
TEST(CudaIpc, ChildSide) {
  const char* handle_hex = std::getenv(kIpcChildEnv);
  if (handle_hex == nullptr) GTEST_SKIP() << "runs as the child of CudaIpc.AnotherProcessMapsTheAllocation";
  std::string why;
  auto rt = gpu::make_cuda(&why);
  ASSERT_TRUE(rt) << why;
  gpu::IpcHandle h;
  const std::string text = handle_hex;
  ASSERT_EQ(text.size() % 2, 0u);
  for (std::size_t i = 0; i < text.size(); i += 2) h.bytes += static_cast<char>(std::stoi(text.substr(i, 2), nullptr, 16));
  // More than the allocation holds: refused (and unmapped again, so the next open works).
  EXPECT_EQ(code_of([&] { rt->ipc_open(h, std::size_t{64} << 20); }), ErrorCode::InvalidUsage);
  void* p = rt->ipc_open(h, kCudaIpcBytes);
  ASSERT_NE(p, nullptr);
  const gpu::PointerInfo info = rt->classify(p);
  EXPECT_EQ(info.kind, MemoryKind::device);
  EXPECT_EQ(info.device, 0);
  std::vector<unsigned char> host(kCudaIpcBytes);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = cuda_pattern(i);
  rt->copy(p, host.data(), host.size());
  rt->ipc_close(p);
  rt->ipc_close(p);  // unknown now: ignored
}

// ---- The emulation of a GPU's hazards (issue 33, item 6) and the counts (item 7) ----
//
// Each test makes its own emulated runtime with the queues and callback latency it needs
// (EmulationOptions), so one process runs them all. Every wait is bounded: work that
// blocks runs on a std::async thread whose future the test polls with a deadline, and the
// test releases what blocks (signal, which needs no runtime call) before it joins.

namespace {

using namespace std::chrono_literals;

/// How long a test waits for something that must happen (generous: CI under load).
constexpr auto kMust = 10s;
/// How long a test watches something that must not happen.
constexpr auto kMustNot = 300ms;

bool done_within(std::future<void>& f, std::chrono::milliseconds ms) {
  return f.wait_for(ms) == std::future_status::ready;
}
bool done_within(std::future<void>& f, std::chrono::seconds s) {
  return done_within(f, std::chrono::duration_cast<std::chrono::milliseconds>(s));
}

gpu::EmulationOptions queues(int n, int hostfn_us = 5) {
  gpu::EmulationOptions o;
  o.hw_queues = n;
  o.hostfn_us = hostfn_us;
  return o;
}

/// A word the streams wait on, released (set far ahead, as an abort value) when the test
/// ends, so that no executor is left waiting on it whatever failed. It owns the runtime's
/// end: the runtime is destroyed (its executors joined) before the word's memory is freed,
/// as an executor may read the word until then.
struct Word {
  explicit Word(std::unique_ptr<gpu::Runtime>& runtime) : rt(runtime), owned(new std::uint32_t(0)), p(owned.get()) {}
  ~Word() {
    rt->signal(p, 0x40000000u);
    rt.reset();
  }
  std::unique_ptr<gpu::Runtime>& rt;
  std::unique_ptr<std::uint32_t> owned;
  std::uint32_t* p;
};

}  // namespace

TEST(EmulatedQueues, OneQueueAWaitBlocksAnotherStreamsCopy) {
  auto rt = gpu::make_emulated(queues(1));
  EXPECT_EQ(rt->hw_queues(), 1);
  Word word(rt);
  gpu::Stream waiting = rt->create_stream(), other = rt->create_stream();
  int src = 42, dst = 0;
  rt->wait_value(waiting, word.p, 1);
  rt->copy_async(&dst, &src, sizeof src, other);
  auto sync = std::async(std::launch::async, [&] { rt->synchronize(other); });
  EXPECT_FALSE(done_within(sync, kMustNot)) << "one hardware queue: the copy must wait behind the other stream's wait";
  EXPECT_EQ(__atomic_load_n(&dst, __ATOMIC_ACQUIRE), 0);
  rt->signal(word.p, 1);
  ASSERT_TRUE(done_within(sync, kMust)) << "signal() must release both streams";
  EXPECT_EQ(dst, 42);
  rt->synchronize(waiting);
  rt->destroy_stream(waiting);
  rt->destroy_stream(other);
}

TEST(EmulatedQueues, TheDefaultStreamIsMappedToo) {
  auto rt = gpu::make_emulated(queues(1));
  Word word(rt);
  gpu::Stream s = rt->create_stream();
  rt->wait_value(nullptr, word.p, 1);  // the default stream of device 0, on its one queue
  int one = 1, out = 0;
  rt->copy_async(&out, &one, sizeof one, s);
  auto sync = std::async(std::launch::async, [&] { rt->synchronize(s); });
  EXPECT_FALSE(done_within(sync, kMustNot));
  rt->signal(word.p, 1);
  ASSERT_TRUE(done_within(sync, kMust));
  EXPECT_EQ(out, 1);
  rt->synchronize(nullptr);
  rt->destroy_stream(s);
}

TEST(EmulatedQueues, TwoQueuesKeepTwoStreamsApart) {
  auto rt = gpu::make_emulated(queues(2));
  EXPECT_EQ(rt->hw_queues(), 2);
  Word word(rt);
  gpu::Stream waiting = rt->create_stream(), other = rt->create_stream();  // queues 0 and 1
  int src = 7, dst = 0;
  rt->wait_value(waiting, word.p, 1);
  rt->copy_async(&dst, &src, sizeof src, other);
  auto sync = std::async(std::launch::async, [&] { rt->synchronize(other); });
  ASSERT_TRUE(done_within(sync, kMust)) << "streams on different queues must not block each other";
  EXPECT_EQ(dst, 7);
  auto sync_waiting = std::async(std::launch::async, [&] { rt->synchronize(waiting); });
  EXPECT_FALSE(done_within(sync_waiting, kMustNot)) << "the waiting stream itself still waits";
  rt->signal(word.p, 1);
  ASSERT_TRUE(done_within(sync_waiting, kMust));
  // A third stream wraps round onto queue 0: blocked by a wait there again.
  gpu::Stream third = rt->create_stream();
  rt->wait_value(waiting, word.p, 2);
  rt->copy_async(&dst, &src, sizeof src, third);
  auto sync_third = std::async(std::launch::async, [&] { rt->synchronize(third); });
  EXPECT_FALSE(done_within(sync_third, kMustNot)) << "streams map round-robin: the third shares queue 0";
  rt->signal(word.p, 2);
  ASSERT_TRUE(done_within(sync_third, kMust));
  for (gpu::Stream s : {waiting, other, third}) rt->destroy_stream(s);
}

// CUDA's lazy loading (the default since 12.2): a kernel's first launch loads it, and the
// load waits for the whole device. With a stream waiting on a word that the host sets only
// after the launch returns, the first launch blocks (on a GPU, for ever); a device whose
// kernels load_kernels() loaded takes the launch at once. Seen on the H200 (docs/gpu.md,
// "Lazy loading"); the communicator calls load_kernels at creation.
void nothing(void*) {}

TEST(EmulatedLazyLoading, AFirstLaunchWaitsForTheDeviceUnlessItsKernelsWereLoaded) {
  for (bool loaded : {false, true}) {
    SCOPED_TRACE(loaded ? "loaded at creation" : "lazy");
    auto rt = gpu::make_emulated(queues(8));
    if (loaded) rt->load_kernels(0);
    Word word(rt);
    gpu::Stream waiting = rt->create_stream(), s = rt->create_stream();
    rt->wait_value(waiting, word.p, 1);  // e.g. the caller's own work, held by a gate
    auto launch = std::async(std::launch::async, [&] { rt->launch_emulated_kernel(s, nothing, nullptr); });
    if (loaded) {
      EXPECT_TRUE(done_within(launch, kMust)) << "a loaded kernel's launch must not wait for the device";
    } else {
      EXPECT_FALSE(done_within(launch, kMustNot)) << "a first launch must wait for the device, as CUDA's lazy load does";
    }
    rt->signal(word.p, 1);
    ASSERT_TRUE(done_within(launch, kMust));
    // Loaded now: the second launch of the same kernel does not wait, even behind a wait.
    rt->wait_value(waiting, word.p, 2);
    auto again = std::async(std::launch::async, [&] { rt->launch_emulated_kernel(s, nothing, nullptr); });
    EXPECT_TRUE(done_within(again, kMust));
    rt->signal(word.p, 2);
    rt->synchronize(s);
    rt->synchronize(waiting);
    rt->destroy_stream(waiting);
    rt->destroy_stream(s);
  }
}

TEST(EmulatedStreamMemops, WriteValueReleasesAWaitOnAnotherStream) {
  auto rt = gpu::make_emulated(queues(2));
  Word word(rt);
  gpu::Stream waiter = rt->create_stream(), writer = rt->create_stream();
  int src = 5, dst = 0;
  rt->wait_value(waiter, word.p, 3);
  rt->copy_async(&dst, &src, sizeof src, waiter);
  rt->write_value(writer, word.p, 3);
  auto sync = std::async(std::launch::async, [&] { rt->synchronize(waiter); });
  ASSERT_TRUE(done_within(sync, kMust));
  EXPECT_EQ(dst, 5);
  EXPECT_EQ(__atomic_load_n(word.p, __ATOMIC_ACQUIRE), 3u);
  rt->synchronize(writer);
  for (gpu::Stream s : {waiter, writer}) rt->destroy_stream(s);
}

TEST(EmulatedStreamMemops, WaitsCompareCyclically) {
  auto rt = gpu::make_emulated(queues(2));
  Word word(rt);
  gpu::Stream s = rt->create_stream();
  rt->signal(word.p, 5);
  // Reached: equal, behind, and behind across the wrap (0xfffffff0 + 21 == 5 mod 2^32).
  for (std::uint32_t v : {5u, 3u, 0xfffffff0u}) rt->wait_value(s, word.p, v);
  auto passed = std::async(std::launch::async, [&] { rt->synchronize(s); });
  ASSERT_TRUE(done_within(passed, kMust)) << "a word at 5 has reached 5, 3 and 0xfffffff0";
  rt->wait_value(s, word.p, 6);  // ahead: waits
  auto ahead = std::async(std::launch::async, [&] { rt->synchronize(s); });
  EXPECT_FALSE(done_within(ahead, kMustNot));
  rt->signal(word.p, 0x40000000u);  // an abort value far ahead releases it
  ASSERT_TRUE(done_within(ahead, kMust));
  rt->destroy_stream(s);
}

TEST(EmulatedStreamMemops, OneQueueAWriteBehindTheWaitNeverComes) {
  // The hazard of call-time enqueue on one queue: the write that would release a wait is
  // enqueued on another stream of the same queue after it, so it never runs (a GPU hangs
  // here with CUDA_DEVICE_MAX_CONNECTIONS=1); only the host can release it.
  auto rt = gpu::make_emulated(queues(1));
  Word word(rt);
  gpu::Stream waiter = rt->create_stream(), writer = rt->create_stream();
  rt->wait_value(waiter, word.p, 1);
  rt->write_value(writer, word.p, 1);
  auto sync = std::async(std::launch::async, [&] { rt->synchronize(waiter); });
  EXPECT_FALSE(done_within(sync, kMustNot)) << "the write must queue behind the wait";
  EXPECT_EQ(__atomic_load_n(word.p, __ATOMIC_ACQUIRE), 0u);
  rt->signal(word.p, 1);
  ASSERT_TRUE(done_within(sync, kMust));
  rt->synchronize(writer);
  for (gpu::Stream s : {waiter, writer}) rt->destroy_stream(s);
}

TEST(EmulatedEvents, AnEventOrdersTwoStreams) {
  auto rt = gpu::make_emulated(queues(4));
  Word word(rt);
  gpu::Stream first = rt->create_stream(), second = rt->create_stream(), third = rt->create_stream();
  gpu::Event e = rt->create_event();
  rt->wait_event(second, e);  // nothing recorded yet: no wait
  auto unrecorded = std::async(std::launch::async, [&] { rt->synchronize(second); });
  ASSERT_TRUE(done_within(unrecorded, kMust)) << "a wait on an event never recorded does not wait";
  int a = 9, b = 0, c = 0;
  rt->wait_value(first, word.p, 1);
  rt->copy_async(&b, &a, sizeof a, first);
  rt->record_event(e, first);  // generation 1: behind the wait
  rt->wait_event(second, e);
  rt->copy_async(&c, &b, sizeof b, second);
  rt->record_event(e, third);  // generation 2, complete at once: the wait is for generation 1
  rt->synchronize(third);
  auto sync = std::async(std::launch::async, [&] { rt->synchronize(second); });
  EXPECT_FALSE(done_within(sync, kMustNot)) << "the second stream waits for the capture recorded before its wait";
  EXPECT_EQ(__atomic_load_n(&c, __ATOMIC_ACQUIRE), 0);
  rt->signal(word.p, 1);
  ASSERT_TRUE(done_within(sync, kMust));
  EXPECT_EQ(c, 9);
  rt->destroy_event(e);
  for (gpu::Stream s : {first, second, third}) rt->destroy_stream(s);
}

namespace {
struct HostFnProbe {
  std::mutex mu;
  std::set<std::thread::id> threads;
  std::atomic<int> returned{0};
  std::atomic<int> seen_before_kernel{-1};
};
void host_fn(void* arg) {
  auto* p = static_cast<HostFnProbe*>(arg);
  {
    std::lock_guard<std::mutex> lock(p->mu);
    p->threads.insert(std::this_thread::get_id());
  }
  std::this_thread::sleep_for(20ms);
  p->returned.fetch_add(1);
}
void after_host_fn(void* arg) {
  auto* p = static_cast<HostFnProbe*>(arg);
  p->seen_before_kernel.store(p->returned.load());
}
}  // namespace

TEST(EmulatedHostFunctions, RunOnOneThreadAndTheStreamWaitsForThem) {
  auto rt = gpu::make_emulated(queues(4, 50));
  HostFnProbe probe;
  std::vector<gpu::Stream> streams;
  for (int i = 0; i < 3; ++i) streams.push_back(rt->create_stream());
  for (gpu::Stream s : streams) rt->launch_host(s, host_fn, &probe);
  rt->launch_emulated_kernel(streams[0], after_host_fn, &probe);
  auto sync = std::async(std::launch::async, [&] {
    for (gpu::Stream s : streams) rt->synchronize(s);
  });
  ASSERT_TRUE(done_within(sync, kMust));
  EXPECT_EQ(probe.returned.load(), 3);
  EXPECT_EQ(probe.threads.size(), 1u) << "host functions of every stream run on the one callback thread";
  EXPECT_EQ(probe.threads.count(std::this_thread::get_id()), 0u);
  EXPECT_GE(probe.seen_before_kernel.load(), 1) << "the stream goes on only once its host function has returned";
  for (gpu::Stream s : streams) rt->destroy_stream(s);
}

TEST(EmulatedQuiesce, FreeDeviceWaitsForTheDeviceAndHoldsTheDriverLock) {
  auto rt = gpu::make_emulated(queues(2));
  gpu::EmulationHooks* hooks = gpu::emulation_hooks(*rt);
  ASSERT_NE(hooks, nullptr);
  Word word(rt);
  gpu::Stream s = rt->create_stream();
  void* dev = rt->alloc_device(4096, 0);
  rt->wait_value(s, word.p, 1);
  // The thread that would release the stream, but only after one more runtime call: the
  // progress thread of a path that waits on the host (the deadlock of issue 33).
  std::atomic<bool> freed{false}, released{false};
  auto freer = std::async(std::launch::async, [&] {
    rt->free_device(dev);
    freed = true;
  });
  const auto deadline = std::chrono::steady_clock::now() + kMust;
  while (!hooks->quiescing() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(hooks->quiescing()) << "free_device must be waiting for the device";
  auto releaser = std::async(std::launch::async, [&] {
    (void)rt->classify(&released);  // blocks at the driver lock
    rt->signal(word.p, 1);
    released = true;
  });
  EXPECT_FALSE(done_within(freer, kMustNot)) << "free_device must wait for the waiting stream";
  EXPECT_FALSE(done_within(releaser, std::chrono::milliseconds(10)))
      << "another thread's runtime call must block while free_device holds the driver lock";
  EXPECT_FALSE(freed.load());
  EXPECT_FALSE(released.load());
  // Deadlocked, as on a GPU. A host store needs no driver call: the test releases it.
  rt->signal(word.p, 1);
  ASSERT_TRUE(done_within(freer, kMust));
  ASSERT_TRUE(done_within(releaser, kMust));
  EXPECT_EQ(rt->classify(dev).kind, MemoryKind::host) << "freed";
  rt->destroy_stream(s);
}

TEST(EmulatedQuiesce, FreeDeviceOfAnotherDeviceDoesNotWait) {
  auto rt = gpu::make_emulated(queues(1));
  Word word(rt);
  gpu::Stream s = rt->create_stream();  // device 0
  rt->wait_value(s, word.p, 1);
  void* dev = rt->alloc_device(4096, 1);
  auto freer = std::async(std::launch::async, [&] { rt->free_device(dev); });
  ASSERT_TRUE(done_within(freer, kMust)) << "the quiesce is of the allocation's device only";
  rt->signal(word.p, 1);
  rt->synchronize(s);
  rt->destroy_stream(s);
}

TEST(GpuCounts, EachKindCountsWhatItShould) {
  auto rt = gpu::make_emulated(queues(2, 0));
  Word word(rt);
  gpu::Stream s = rt->create_stream();
  HostFnProbe probe;
  const gpu::Counts before = gpu::counts();
  rt->launch_host(s, host_fn, &probe);                   // api, hostfn
  rt->write_value(s, word.p, 1);                         // api, memops
  rt->wait_value(s, word.p, 1);                          // api, memops
  rt->launch_emulated_kernel(s, after_host_fn, &probe);  // api, launch
  rt->synchronize(s);                                    // api, sync
  int a = 1, b = 0;
  rt->copy(&b, &a, sizeof a);  // api, sync
  rt->signal(word.p, 2);       // a host store: nothing
  (void)rt->hw_queues();       // no driver call: nothing
  gpu::count_launch();         // a launch of a real kernel: launch only
  const gpu::Counts after = gpu::counts();
  EXPECT_EQ(after.caller_api - before.caller_api, 6u);
  EXPECT_EQ(after.progress_api - before.progress_api, 0u);
  EXPECT_EQ(after.hostfn - before.hostfn, 1u);
  EXPECT_EQ(after.memops - before.memops, 2u);
  EXPECT_EQ(after.launch - before.launch, 2u);
  EXPECT_EQ(after.sync - before.sync, 2u);
  std::thread([&] {
    gpu::mark_progress_thread();
    (void)rt->current_device();
    (void)rt->classify(&a);
  }).join();
  const gpu::Counts last = gpu::counts();
  EXPECT_EQ(last.progress_api - after.progress_api, 2u);
  EXPECT_EQ(last.caller_api - after.caller_api, 0u);
  // The backend without a device counts its calls too, refused or not.
  auto none = gpu::make_none("a test");
  EXPECT_EQ(none->hw_queues(), 0);
  EXPECT_THROW(none->create_stream(), Error);
  EXPECT_THROW(none->write_value(nullptr, word.p, 1), Error);
  EXPECT_EQ(gpu::counts().caller_api - last.caller_api, 2u);
  rt->destroy_stream(s);
}

TEST(EmulatedHazards, AStickyErrorFailsItsDeviceOnly) {
  auto rt = gpu::make_emulated(queues(2));
  gpu::EmulationHooks* hooks = gpu::emulation_hooks(*rt);
  ASSERT_NE(hooks, nullptr);
  EXPECT_EQ(gpu::emulation_hooks(*gpu::make_none("a test")), nullptr);
  Word word(rt);
  gpu::Stream s = rt->create_stream();  // device 0
  HostFnProbe probe;
  rt->wait_value(s, word.p, 1);
  rt->launch_host(s, host_fn, &probe);  // queued behind the wait: never called
  hooks->inject_sticky_error(0);
  const std::string says = message_of([&] { rt->synchronize(s); });
  EXPECT_NE(says.find("sticky"), std::string::npos) << says;
  EXPECT_EQ(code_of([&] { rt->alloc_device(64, 0); }), ErrorCode::Cuda);
  EXPECT_EQ(code_of([&] { rt->copy_async(&probe, &probe, 1, s); }), ErrorCode::Cuda);
  EXPECT_EQ(code_of([&] { rt->create_stream(); }), ErrorCode::Cuda) << "device 0 is current";
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(probe.returned.load(), 0) << "host functions are not called after a sticky error";
  // Device 1 still works.
  rt->set_device(1);
  gpu::Stream s1 = rt->create_stream();
  int a = 3, b = 0;
  rt->copy_async(&b, &a, sizeof a, s1);
  rt->synchronize(s1);
  EXPECT_EQ(b, 3);
  rt->destroy_stream(s1);
  EXPECT_EQ(code_of([&] { rt->set_device(0); }), ErrorCode::Cuda);
  hooks->reset_hooks();
  rt->set_device(0);
  rt->synchronize(s);  // its work was dropped: nothing left to wait for
  rt->destroy_stream(s);
}

TEST(EmulatedHazards, AnUnsafeCallInvalidatesAGlobalCapture) {
  auto rt = gpu::make_emulated(queues(2));
  gpu::EmulationHooks* hooks = gpu::emulation_hooks(*rt);
  ASSERT_NE(hooks, nullptr);
  gpu::Stream s = rt->create_stream();
  hooks->begin_global_capture(s);
  EXPECT_TRUE(rt->capturing(s));
  std::string says;
  std::thread([&] { says = message_of([&] { rt->alloc_device(64, 0); }); }).join();
  EXPECT_NE(says.find("global mode"), std::string::npos) << says;
  const std::string ended = message_of([&] { hooks->end_global_capture(s); });
  EXPECT_NE(ended.find("invalidated"), std::string::npos) << ended;
  EXPECT_FALSE(rt->capturing(s));
  // A capture nobody disturbs ends cleanly, and the calls are allowed again afterwards.
  hooks->begin_global_capture(s);
  int a = 1, b = 0;
  rt->copy_async(&b, &a, sizeof a, s);  // stream work is what a capture records
  EXPECT_NO_THROW(hooks->end_global_capture(s));
  void* p = rt->alloc_device(64, 0);
  rt->free_device(p);
  hooks->reset_hooks();
  rt->synchronize(s);
  rt->destroy_stream(s);
}

TEST(EmulatedHazards, ContextsAreMadeOncePerDevice) {
  auto rt = gpu::make_emulated(queues(2));
  gpu::EmulationHooks* hooks = gpu::emulation_hooks(*rt);
  ASSERT_NE(hooks, nullptr);
  EXPECT_EQ(hooks->contexts_made(), 0u);
  EXPECT_EQ(rt->current_device(), 0);  // asking makes none
  EXPECT_EQ(hooks->contexts_made(), 0u);
  std::thread([&] {
    rt->set_device(1);
    EXPECT_EQ(rt->current_device(), 1);
  }).join();
  EXPECT_EQ(rt->current_device(), 0) << "the current device is per thread";
  EXPECT_EQ(hooks->contexts_made(), 1u);
  void* p = rt->alloc_device(64, 1);  // device 1's context exists already
  EXPECT_EQ(hooks->contexts_made(), 1u);
  gpu::Stream s = rt->create_stream();  // on device 0, current here: its context now
  EXPECT_EQ(hooks->contexts_made(), 2u);
  rt->free_device(p);
  rt->destroy_stream(s);
}
