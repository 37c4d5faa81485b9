// Ranks as threads and as forked processes, and the grids' fixture (see test_support.hpp).
#include "test_support.hpp"

#include "core/config.hpp"
#include "transport/registry.hpp"

#include <gtest/gtest.h>

#include <dlfcn.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace braid::test {

#ifdef BRAID_FAKEVERBS_LIBRARY
// The verbs transport runs against the test provider (tests/support/fakeverbs) wherever a
// test does not name another libibverbs: the grids and the conformance suite take every
// registered transport, and these machines have no RDMA device. A test binary sets it for
// the ranks it spawns too (they inherit the environment).
//
// Under ThreadSanitizer the fake is also loaded here, before main: gcc's TSan symbolizes with
// libbacktrace, which reads the list of loaded libraries once, at the process's first
// symbolization (any report, a suppressed one included), and never again, so the frames of
// a library dlopen'ed after that print as "<null> (libfakeverbs.so+0x...)" and no
// suppression or reader can name them. Loaded now, the fake is in that list; the
// transport's own dlopen of the same path later finds it loaded. (The fake starts no
// thread until a device is opened, so forked ranks still fork a single-threaded process.)
[[maybe_unused]] const bool kFakeVerbs = [] {
  ::setenv("BRAID_IBVERBS_LIBRARY", BRAID_FAKEVERBS_LIBRARY, 0);
  if (kThreadSanitizer && std::strcmp(std::getenv("BRAID_IBVERBS_LIBRARY"), BRAID_FAKEVERBS_LIBRARY) == 0)
    (void)::dlopen(BRAID_FAKEVERBS_LIBRARY, RTLD_NOW | RTLD_LOCAL);  // never closed, like the transport's
  return true;
}();
#endif

namespace {

// Each pair's transport as describe_topology() reports it ("  rank 0: 1=tcp 2=shm" lines
// after "transport per pair (BRAID_TRANSPORT=<mode>):"); returns the mode, or "" when the
// text has no such section.
std::string pairs_of(const std::string& text, std::vector<std::string>& names) {
  const std::string head = "transport per pair (BRAID_TRANSPORT=";
  const std::size_t at = text.find(head);
  if (at == std::string::npos) return {};
  const std::size_t close = text.find(')', at);
  const std::string mode = text.substr(at + head.size(), close - at - head.size());
  std::istringstream lines(text.substr(text.find('\n', at) + 1));
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line.substr(line.find(':') + 1));
    std::string w;
    while (words >> w) names.push_back(w.substr(w.find('=') + 1));
  }
  return mode;
}

}  // namespace

Group::Group(int n, const CommOptions& options, int hosts, const std::string& transport)
    : server_(std::make_unique<TcpStoreServer>("127.0.0.1", 0)) {
  comms_.resize(static_cast<std::size_t>(n));
  const auto port = server_->port();
  run_threads(n, [&](int r) {
    CommOptions o = options;
    if (hosts > 0) o.host_id = "emulated-host-" + std::to_string(r * hosts / n);
    if (!transport.empty()) o.transport = transport;
    comms_[static_cast<std::size_t>(r)] =
        std::make_unique<Communicator>(std::make_shared<TcpStore>("127.0.0.1", port), r, n, o);
  });
  if (transport.empty()) return;
  // The tests' proof that the group runs over `transport`: every communicator's router says
  // so for every pair (it is the router the engine connects pairs with).
  for (int r = 0; r < n; ++r) {
    const std::string text = comms_[static_cast<std::size_t>(r)]->describe_topology();
    std::vector<std::string> names;
    const std::string mode = pairs_of(text, names);
    bool ok = mode == transport && names.size() == static_cast<std::size_t>(n) * static_cast<std::size_t>(n - 1);
    for (const auto& name : names)
      ok = ok && (transport == "auto" ? transport::find_transport(name) != nullptr : name == transport);
    if (!ok) throw std::runtime_error("test::Group over " + transport + ": rank " + std::to_string(r) + " has\n" + text);
  }
}

void PrintTo(const GridPoint& p, std::ostream* os) { *os << p.transport << " x " << p.world << " ranks"; }

std::vector<std::string> grid_transports() {
  std::vector<std::string> out{"auto"};
  for (const auto* e : transport::registry()) out.emplace_back(e->name);
  return out;
}

std::vector<GridPoint> grid(const std::vector<int>& worlds, const std::map<std::string, std::vector<int>>& special) {
  std::vector<GridPoint> out;
  for (const auto& t : grid_transports()) {
    const auto it = special.find(t);
    for (int n : it == special.end() ? worlds : it->second) out.push_back({t, n});
  }
  return out;
}

std::string grid_name(const ::testing::TestParamInfo<GridPoint>& info) {
  std::string name = info.param.transport + "_n" + std::to_string(info.param.world);
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';  // gtest names: [A-Za-z0-9_]
  return name;
}


Group::~Group() {
  // Leave together, as a job's ranks do (a rank that leaves waits for the others).
  run_threads(size(), [&](int r) { comms_[static_cast<std::size_t>(r)].reset(); });
}

void run_threads(int size, const std::function<void(int rank)>& fn) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

namespace {

/// Runs fn(rank) in a child: exit status 0 when it returns with no gtest failure, else 1.
[[noreturn]] void run_child(int rank, const std::function<void(int rank)>& fn) {
  int code = 0;
  try {
    fn(rank);
    if (::testing::Test::HasFailure()) code = 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d threw: %s\n", rank, e.what());
    code = 1;
  } catch (...) {
    code = 1;
  }
  std::fflush(nullptr);
  _exit(code);
}

/// Waits for the children, killing those still running at the deadline.
std::vector<int> wait_children(const std::vector<pid_t>& pids, std::chrono::seconds timeout) {
  std::vector<int> status(pids.size(), -1);
  std::size_t left = pids.size();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (left > 0) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (status[i] != -1) continue;
      int st = 0;
      if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        status[i] = st;
        --left;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (std::size_t i = 0; i < pids.size(); ++i)
        if (status[i] == -1) {
          kill(pids[i], SIGKILL);
          int st = 0;
          waitpid(pids[i], &st, 0);
          status[i] = st;
          ADD_FAILURE() << "rank " << i << " still running after " << timeout.count() << " s: killed";
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return status;
}

constexpr const char* kSpawnedRank = "BRAID_TEST_SPAWNED_RANK";

}  // namespace

std::vector<int> run_processes(int size, const std::function<void(int rank)>& fn, std::chrono::seconds timeout) {
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      ADD_FAILURE() << "fork failed";
      break;
    }
    if (pid == 0) run_child(r, fn);
    pids.push_back(pid);
  }
  return wait_children(pids, timeout);
}

std::vector<int> run_spawned(int size, const std::function<void(int rank)>& fn, std::chrono::seconds timeout) {
  if (const char* r = std::getenv(kSpawnedRank)) run_child(std::atoi(r), fn);
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (!info) {
    ADD_FAILURE() << "run_spawned outside a test";
    return {};
  }
  const std::string filter = std::string("--gtest_filter=") + info->test_suite_name() + "." + info->name();
  char exe[] = "/proc/self/exe";
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, kSpawnedRank, std::strlen(kSpawnedRank)) != 0) env_strings.emplace_back(*e);
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    std::vector<std::string> env = env_strings;
    env.push_back(std::string(kSpawnedRank) + "=" + std::to_string(r));
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string arg0 = "/proc/self/exe", arg1 = filter;
    char* argv[] = {arg0.data(), arg1.data(), nullptr};
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, exe, nullptr, nullptr, argv, envp.data());
    if (rc != 0) {
      ADD_FAILURE() << "posix_spawn of this test binary failed: " << std::strerror(rc);
      break;
    }
    pids.push_back(pid);
  }
  return wait_children(pids, timeout);
}

std::string shared_value(const std::string& name, const std::string& parent_value) {
  const std::string key = "BRAID_TEST_SHARED_" + name;
  if (std::getenv(kSpawnedRank)) {
    const char* v = std::getenv(key.c_str());
    return v ? v : parent_value;
  }
  ::setenv(key.c_str(), parent_value.c_str(), 1);
  return parent_value;
}

void run_processes_ok(int size, const std::function<void(int rank)>& fn, std::chrono::seconds timeout) {
  const auto st = run_processes(size, fn, timeout);
  for (std::size_t i = 0; i < st.size(); ++i)
    EXPECT_TRUE(WIFEXITED(st[i]) && WEXITSTATUS(st[i]) == 0)
        << "rank " << i << (WIFSIGNALED(st[i]) ? " killed by signal " + std::to_string(WTERMSIG(st[i]))
                                               : " exited with " + std::to_string(WEXITSTATUS(st[i])));
}

std::string temp_path(const std::string& stem) {
  // Skips paths that exist: a test process may get the pid of one from an earlier run whose
  // FileStore files are still there (a store found full of another run's keys).
  static std::atomic<int> n{0};
  for (;;) {
    std::string p = "/tmp/braid-" + stem + "-" + std::to_string(getpid()) + "-" + std::to_string(n++);
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 && errno == ENOENT) return p;
  }
}

}  // namespace braid::test
