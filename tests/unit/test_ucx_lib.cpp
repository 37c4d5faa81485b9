// The UCX loader (src/transport/ucx/ucx_lib.cpp): libucp opened with dlopen, its resources
// listed through a throw-away context. UCX is loaded once per process, so each case that
// needs its own environment or library path runs in a forked child.
#include <braid/config.hpp>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#if BRAID_HAVE_UCX
#include "transport/ucx/ucx_probe.hpp"

namespace ucx = braid::transport::ucx;

namespace {

/// Runs fn in a forked child and returns what it wrote (its result line).
std::string in_child(const std::function<std::string()>& fn) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const std::string out = fn();
    const ssize_t n = ::write(fds[1], out.data(), out.size());
    ::_exit(n == static_cast<ssize_t>(out.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  std::string got;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) got.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  return got;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(UcxLib, ProbeListsTheResourcesUcxTlsAllows) {
  const std::string all = in_child([] { return ucx::describe(ucx::probe("")); });
  if (has(all, "cannot load libucp.so.0")) GTEST_SKIP() << "libucp is not installed here: " << all;
  ASSERT_FALSE(has(all, "unavailable")) << all;
  // Loopback always exists; where UCX lists it among the machine's interfaces (eth0,
  // docker0, bridges) depends on the machine, so only its presence is checked.
  EXPECT_TRUE(has(all, "tcp (lo") || has(all, ", lo,") || has(all, ", lo)")) << all;
  EXPECT_TRUE(has(all, "memory host")) << all;
  EXPECT_TRUE(has(all, "RDMA none")) << all;  // no RDMA device on these machines
  const std::string tcp_only = in_child([] {
    ::setenv("UCX_TLS", "tcp", 1);
    const ucx::Status s = ucx::probe("");
    std::string out = ucx::describe(s) + "|";
    for (const auto& r : s.resources) out += r + ";";
    return out;
  });
  ASSERT_TRUE(has(tcp_only, "|tcp/lo;") || has(tcp_only, ";tcp/lo;")) << tcp_only;
  EXPECT_FALSE(has(tcp_only, "posix")) << tcp_only;
  EXPECT_FALSE(has(tcp_only, "sysv")) << tcp_only;
}

// What the ucx transport gives UCX as NET_DEVICES: braid's interface for tcp, whatever
// else the machine has (issue 38: a bridge another job made aborted a rank inside UCX),
// and every RDMA device, which the restriction must not drop.
TEST(UcxLib, NetDevicesKeepBraidsInterfaceForTcpAndEveryRdmaDevice) {
  const std::vector<std::string> machine = {"self/memory", "tcp/eth0", "tcp/docker0", "tcp/vcbr0", "tcp/lo",
                                            "posix/memory", "rc_mlx5/mlx5_0:1", "ud_verbs/mlx5_0:1",
                                            "dc_mlx5/mlx5_1:1"};
  EXPECT_EQ(ucx::net_devices_for(machine, "lo"), "lo,mlx5_0:1,mlx5_1:1");
  EXPECT_EQ(ucx::net_devices_for(machine, "eth0"), "eth0,mlx5_0:1,mlx5_1:1");
  // An interface UCX's tcp does not offer, or the only one it offers: nothing to change.
  EXPECT_EQ(ucx::net_devices_for(machine, "ib0"), "");
  EXPECT_EQ(ucx::net_devices_for({"tcp/lo", "posix/memory"}, "lo"), "");
  EXPECT_EQ(ucx::net_devices_for({"posix/memory", "rc_mlx5/mlx5_0:1"}, "lo"), "");
  EXPECT_EQ(ucx::net_devices_for({"tcp/eth0", "tcp/lo", "sysv/memory"}, "lo"), "lo");
}

TEST(UcxLib, AMissingLibraryIsUnavailableWithTheReasonAndTheFix) {
  const std::string out = in_child([] { return ucx::describe(ucx::probe("/nonexistent/libucp.so.0")); });
  EXPECT_TRUE(has(out, "unavailable: cannot load /nonexistent/libucp.so.0")) << out;
  EXPECT_TRUE(has(out, "BRAID_UCX_LIBRARY")) << out;
}

TEST(UcxLib, ALibraryThatIsNotUcpIsRefusedNamingTheMissingEntryPoint) {
  const std::string out = in_child([] { return ucx::describe(ucx::probe("libm.so.6")); });
  EXPECT_TRUE(has(out, "unavailable: libm.so.6 has no ucp_")) << out;
}

TEST(UcxLib, AnUnusableTransportSelectionIsReportedNotThrown) {
  const std::string out = in_child([] {
    ::setenv("UCX_TLS", "no_such_transport", 1);
    return ucx::describe(ucx::probe(""));
  });
  if (has(out, "cannot load libucp.so.0")) GTEST_SKIP() << "libucp is not installed here: " << out;
  EXPECT_TRUE(has(out, "unavailable: ucp_init")) << out;
  EXPECT_TRUE(has(out, "UCX_TLS")) << out;
}

TEST(UcxLib, RdmaTransportsAreTheReliableAndDatagramVerbsOnes) {
  for (const char* tl : {"rc_verbs", "rc_mlx5", "dc_mlx5", "ud_verbs", "ud_mlx5", "rc", "ud"})
    EXPECT_TRUE(ucx::is_rdma_transport(tl)) << tl;
  for (const char* tl : {"tcp", "self", "posix", "sysv", "cma", "cuda_copy", "cuda_ipc", "rdmacm", "dcx"})
    EXPECT_FALSE(ucx::is_rdma_transport(tl)) << tl;
}

#else
TEST(UcxLib, NotBuilt) { GTEST_SKIP() << "built without UCX headers (BRAID_WITH_UCX; install libucx-dev)"; }
#endif
