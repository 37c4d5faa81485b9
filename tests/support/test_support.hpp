// Test harness: ranks as threads (fast, one address space) and ranks as forked
// processes (real isolation and real failures), after Gloo's base_test.h and
// MultiProcTest.
#pragma once

#include <braid/communicator.hpp>
#include <braid/options.hpp>
#include <braid/store.hpp>

#include <chrono>
#include <functional>
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

/// Runs run_processes and adds a gtest failure naming every child that did not exit 0.
void run_processes_ok(int size, const std::function<void(int rank)>& fn,
                      std::chrono::seconds timeout = std::chrono::seconds(120));

/// `n` communicators of one group in this process (ranks as threads), bootstrapped through a
/// TCP store server on loopback; made together and destroyed together, as a job's ranks.
/// `hosts` > 0 spreads the ranks over that many emulated hosts in blocks of n/hosts
/// (CommOptions::host_id "emulated-host-<k>"), so that the topology, the router and the
/// hierarchical algorithms see several hosts.
class Group {
 public:
  explicit Group(int n, const CommOptions& options = {}, int hosts = 0);
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  Communicator& operator[](int r) { return *comms_[static_cast<std::size_t>(r)]; }
  int size() const { return static_cast<int>(comms_.size()); }

 private:
  std::unique_ptr<TcpStoreServer> server_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

/// A fresh path under $TMPDIR (or /tmp) that does not exist yet: "<dir>/braid-<stem>-<pid>-<n>".
std::string temp_path(const std::string& stem);

}  // namespace braid::test
