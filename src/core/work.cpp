// braid::Work: a thin handle over WorkState.
#include "core/work_state.hpp"

namespace braid {

Work::Work() noexcept = default;
Work::~Work() = default;
Work::Work(const Work&) noexcept = default;
Work& Work::operator=(const Work&) noexcept = default;
Work::Work(Work&&) noexcept = default;
Work& Work::operator=(Work&&) noexcept = default;
Work::Work(std::shared_ptr<detail::WorkState> state) noexcept : state_(std::move(state)) {}

void Work::wait() const {
  if (!state_) return;
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Work::wait(std::chrono::milliseconds timeout) const {
  if (!state_) return true;
  if (timeout >= std::chrono::hours(24 * 365)) {  // "forever": avoid deadline overflow
    wait();
    return true;
  }
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!state_->cv.wait_for(lock, timeout, [&] { return state_->done; })) return false;
  if (state_->error) std::rethrow_exception(state_->error);
  return true;
}

bool Work::test() const noexcept {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

std::exception_ptr Work::exception() const noexcept {
  if (!state_) return nullptr;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->error;
}

}  // namespace braid
