// Test harness: ranks as threads (fast, one address space) and ranks as forked
// processes (real isolation and real failures), after Gloo's base_test.h and
// MultiProcTest.
#pragma once

#include <chrono>
#include <functional>
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

/// A fresh path under $TMPDIR (or /tmp) that does not exist yet: "<dir>/braid-<stem>-<pid>-<n>".
std::string temp_path(const std::string& stem);

}  // namespace braid::test
