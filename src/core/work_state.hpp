// The shared state behind braid::Work, completed by the engine.
#pragma once

#include <braid/work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace braid::detail {

struct WorkState;

/// Lets a thread that waits for a Work drive the progress engine itself instead of
/// sleeping until the engine thread wakes it (see Engine::help). Thread-safe; may
/// outlive the engine, in which case help() returns at once.
struct WorkHelper {
  virtual ~WorkHelper() = default;
  /// Makes progress on the calling thread until `w` completes, `until` passes, or
  /// nothing has moved for the engine's spin time. Never throws; errors land in `w`.
  virtual void help(WorkState& w, std::chrono::steady_clock::time_point until) noexcept = 0;
};

struct WorkState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::atomic<bool> finished{false};  ///< `done` readable without the lock
  std::exception_ptr error;
  std::shared_ptr<WorkHelper> helper;  ///< set by the engine when the work is submitted
  /// When the engine started the operation (collectives: admitted to run), and when it
  /// completed; their difference is what the measured tuner compares. Read `started`
  /// only after `finished`.
  std::chrono::steady_clock::time_point started{};
  std::chrono::steady_clock::time_point ended{};
  /// Work::on_complete callbacks not yet run (under `mu`).
  std::vector<std::function<void(std::exception_ptr)>> callbacks;

  /// Marks the work complete (with `e` on failure), wakes every waiter, then runs the
  /// completion callbacks on this thread, outside the lock. Idempotent: the first
  /// completion wins.
  void complete(std::exception_ptr e = nullptr) noexcept {
    std::vector<std::function<void(std::exception_ptr)>> run;
    std::exception_ptr err;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (done) return;
      done = true;
      ended = std::chrono::steady_clock::now();
      error = std::move(e);
      err = error;
      run.swap(callbacks);
      finished.store(true, std::memory_order_release);
    }
    cv.notify_all();
    for (auto& cb : run) call(cb, err);
  }

  /// Runs one completion callback; what it throws is logged, never propagated.
  static void call(const std::function<void(std::exception_ptr)>& cb, const std::exception_ptr& err) noexcept;
};

}  // namespace braid::detail
