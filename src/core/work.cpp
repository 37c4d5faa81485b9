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

namespace {

void help(detail::WorkState& s, std::chrono::steady_clock::time_point until) {
  if (s.helper && !s.finished.load(std::memory_order_acquire)) s.helper->help(s, until);
}

}  // namespace

void Work::wait() const {
  if (!state_) return;
  help(*state_, std::chrono::steady_clock::time_point::max());
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
  const auto until = std::chrono::steady_clock::now() + timeout;
  help(*state_, until);
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!state_->cv.wait_until(lock, until, [&] { return state_->done; })) return false;
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
