// braid::Work: a thin handle over WorkState.
#include "core/work_state.hpp"

#include "base/logging.hpp"

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

void Work::on_complete(std::function<void(std::exception_ptr error)> callback) const {
  if (!callback) return;
  if (!state_) {
    detail::WorkState::call(callback, nullptr);
    return;
  }
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->done) {
      state_->callbacks.push_back(std::move(callback));
      return;
    }
    err = state_->error;
  }
  detail::WorkState::call(callback, err);
}

void detail::WorkState::call(const std::function<void(std::exception_ptr)>& cb,
                             const std::exception_ptr& err) noexcept {
  try {
    cb(err);
  } catch (const std::exception& e) {
    BRAID_LOG(error, "a Work completion callback threw (dropped): " << e.what());
  } catch (...) {
    BRAID_LOG(error, "a Work completion callback threw a non-standard exception (dropped)");
  }
}

std::exception_ptr Work::exception() const noexcept {
  if (!state_) return nullptr;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->error;
}

}  // namespace braid
