// Ranks as threads and as forked processes (see test_support.hpp).
#include "test_support.hpp"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

namespace braid::test {

Group::Group(int n, const CommOptions& options, int hosts)
    : server_(std::make_unique<TcpStoreServer>("127.0.0.1", 0)) {
  comms_.resize(static_cast<std::size_t>(n));
  const auto port = server_->port();
  run_threads(n, [&](int r) {
    CommOptions o = options;
    if (hosts > 0) o.host_id = "emulated-host-" + std::to_string(r * hosts / n);
    comms_[static_cast<std::size_t>(r)] =
        std::make_unique<Communicator>(std::make_shared<TcpStore>("127.0.0.1", port), r, n, o);
  });
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

std::vector<int> run_processes(int size, const std::function<void(int rank)>& fn, std::chrono::seconds timeout) {
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      ADD_FAILURE() << "fork failed";
      break;
    }
    if (pid == 0) {
      int code = 0;
      try {
        fn(r);
        if (::testing::Test::HasFailure()) code = 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d threw: %s\n", r, e.what());
        code = 1;
      } catch (...) {
        code = 1;
      }
      std::fflush(nullptr);
      _exit(code);
    }
    pids.push_back(pid);
  }
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

void run_processes_ok(int size, const std::function<void(int rank)>& fn, std::chrono::seconds timeout) {
  const auto st = run_processes(size, fn, timeout);
  for (std::size_t i = 0; i < st.size(); ++i)
    EXPECT_TRUE(WIFEXITED(st[i]) && WEXITSTATUS(st[i]) == 0)
        << "rank " << i << (WIFSIGNALED(st[i]) ? " killed by signal " + std::to_string(WTERMSIG(st[i]))
                                               : " exited with " + std::to_string(WEXITSTATUS(st[i])));
}

std::string temp_path(const std::string& stem) {
  static std::atomic<int> n{0};
  return "/tmp/braid-" + stem + "-" + std::to_string(getpid()) + "-" + std::to_string(n++);
}

}  // namespace braid::test
