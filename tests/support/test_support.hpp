// Test harness: ranks as threads (fast, one address space) and ranks as forked
// processes (real isolation and real failures), after Gloo's base_test.h and
// MultiProcTest.
#pragma once

#include <braid/communicator.hpp>
#include <braid/options.hpp>
#include <braid/store.hpp>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace braid::test {

/// Runs fn(rank) for rank in [0, size) on `size` threads and joins them. Rethrows
/// the first exception a rank threw (after every thread has finished).
void run_threads(int size, const std::function<void(int rank)>& fn);

/// Forks `size` child processes running fn(rank). A child exits 0 when fn returns,
/// 1 when it throws (the message goes to stderr) or a gtest assertion failed in it.
/// Children still running after `timeout` are killed. Returns each child's status
/// as from waitpid (use WIFEXITED/WEXITSTATUS); run_processes_ok() asserts success.
std::vector<int> run_processes(int size, const std::function<void(int rank)>& fn,
                               std::chrono::seconds timeout = std::chrono::seconds(120));

/// As run_processes, but each rank is a fresh process: this test binary started again
/// (posix_spawn of /proc/self/exe, no fork) running only the current test, with
/// BRAID_TEST_SPAWNED_RANK=r in its environment. There the test body runs again up to this
/// call, which runs fn(r) and exits the child. For code that cannot survive a fork: CUDA
/// fails in a child forked after the parent used it ("initialization error", seen on an
/// H100). What the body computes before the call must come out the same in the children
/// (pass per-run values through shared_value).
std::vector<int> run_spawned(int size, const std::function<void(int rank)>& fn,
                             std::chrono::seconds timeout = std::chrono::seconds(120));

/// In a test that calls run_spawned: returns `parent_value` in the parent (and puts it in
/// the environment the children inherit), and the parent's value in a spawned child.
std::string shared_value(const std::string& name, const std::string& parent_value);

/// Runs run_processes and adds a gtest failure naming every child that did not exit 0.
void run_processes_ok(int size, const std::function<void(int rank)>& fn,
                      std::chrono::seconds timeout = std::chrono::seconds(120));

/// `n` communicators of one group in this process (ranks as threads), bootstrapped through a
/// TCP store server on loopback; made together and destroyed together, as a job's ranks.
/// `hosts` > 0 spreads the ranks over that many emulated hosts in blocks of n/hosts
/// (CommOptions::host_id "emulated-host-<k>"), so that the topology, the router and the
/// hierarchical algorithms see several hosts.
///
/// `transport` non-empty: the group runs over that transport ("auto" or a registered name,
/// CommOptions::transport), checked after creation from every communicator's
/// describe_topology() (the constructor throws when a pair would use another one). Empty:
/// the options' transport, else BRAID_TRANSPORT.
class Group {
 public:
  explicit Group(int n, const CommOptions& options = {}, int hosts = 0, const std::string& transport = {});
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  Communicator& operator[](int r) { return *comms_[static_cast<std::size_t>(r)]; }
  int size() const { return static_cast<int>(comms_.size()); }

 private:
  std::unique_ptr<TcpStoreServer> server_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

/// One point of a multi-rank grid: a transport ("auto" or a registered name) and a world size.
struct GridPoint {
  std::string transport;
  int world = 1;
};
void PrintTo(const GridPoint& p, std::ostream* os);

/// "auto" first, then every transport of the registry (transport::registry()), so that a
/// transport added to the build joins every grid without a test edit.
std::vector<std::string> grid_transports();

/// transport x world: for each transport of grid_transports(), the worlds `special` gives it
/// (none: the transport is left out), else `worlds`. A transport of `special` that this build
/// lacks is ignored. Use with ::testing::ValuesIn.
///
/// Sizing: CI runs every test twice on 2 cores (Release and ASan), and the shm points once
/// more with BRAID_WAIT_HELPS=1 (the *_wait_helps tests, tests/CMakeLists.txt; Release only for
/// test_allreduce and test_collectives, scripts/test.sh). The suites give
/// shm, what they ran over before the grids (every pair of one host), every world they had;
/// tcp, auto and any transport added later get {2, 3, 5, 8}: the smallest pair, an odd
/// world, a prime one that no ring or halving divides evenly, and the largest (docs/
/// architecture.md has the times). Counts stay loops inside a test: a group costs more to
/// make than a small collective costs to run.
std::vector<GridPoint> grid(const std::vector<int>& worlds, const std::map<std::string, std::vector<int>>& special = {});

/// gtest's name of a grid point: "tcp_n3" (ctest shows Worlds/Collectives.Name/tcp_n3).
std::string grid_name(const ::testing::TestParamInfo<GridPoint>& info);

/// Fixture of the grids: the point's world, transport and host layout; tests make their
/// Group(world(), options, hosts(), transport()).
class GridTest : public ::testing::TestWithParam<GridPoint> {
 protected:
  int world() const { return GetParam().world; }
  const std::string& transport() const { return GetParam().transport; }
  /// The point's host layout (Group's `hosts`): "auto" spreads two or more ranks over two
  /// emulated hosts, so that the router mixes shm within a host and tcp across; a forced
  /// transport keeps one host (it serves every pair either way).
  int hosts() const { return transport() == "auto" && world() >= 2 ? 2 : 0; }
};

/// A fresh path under /tmp that does not exist yet: "/tmp/braid-<stem>-<pid>-<n>" (short, for
/// Unix socket paths), skipping any an earlier process of the same pid left behind.
std::string temp_path(const std::string& stem);

/// Whether this build runs under ThreadSanitizer (scripts/tsan.sh): gcc's macro or clang's
/// feature.
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#else
inline constexpr bool kThreadSanitizer = false;
#endif

/// What a test multiplies its wall-clock bounds by, and the delays they are measured
/// against (so that what it tells apart stays apart): 10 under ThreadSanitizer, which runs
/// braid 5 to 15 times slower, else 1.
inline constexpr int kTimeScale = kThreadSanitizer ? 10 : 1;

/// A server in a process of its own: `serve` runs in the child, writes the u16 port it
/// listens on to the descriptor it is given and serves until it is killed.
struct ServerProcess {
  pid_t pid = -1;
  std::uint16_t port = 0;
  template <class Serve>
  explicit ServerProcess(Serve serve) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    std::fflush(nullptr);
    pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      serve(fds[1]);
      ::_exit(0);
    }
    ::close(fds[1]);
    if (::read(fds[0], &port, sizeof port) != sizeof port) port = 0;
    ::close(fds[0]);
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  void kill() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
  ~ServerProcess() { kill(); }
};

/// A TcpStoreServer in a process of its own (as a launcher's store would be); its port.
struct StoreProcess : ServerProcess {
  StoreProcess()
      : ServerProcess([](int port_fd) {
          TcpStoreServer server("127.0.0.1", 0);
          const std::uint16_t p = server.port();
          if (::write(port_fd, &p, sizeof p) != sizeof p) ::_exit(1);
          for (;;) ::pause();
        }) {}
};

}  // namespace braid::test
