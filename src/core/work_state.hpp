// The shared state behind braid::Work, completed by the engine.
#pragma once

#include <braid/work.hpp>

#include <condition_variable>
#include <exception>
#include <mutex>

namespace braid::detail {

struct WorkState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;

  /// Marks the work complete (with `e` on failure) and wakes every waiter. Idempotent:
  /// the first completion wins.
  void complete(std::exception_ptr e = nullptr) noexcept {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (done) return;
      done = true;
      error = std::move(e);
    }
    cv.notify_all();
  }
};

}  // namespace braid::detail
