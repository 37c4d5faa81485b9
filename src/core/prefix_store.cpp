// braid — PrefixStore: a namespace inside another store ("prefix/key"), and the
// out-of-line destructor of the Store interface.
#include <braid/store.hpp>

#include "base/check.hpp"

#include <utility>

namespace braid {

Store::~Store() = default;

std::string Store::compare_set(const std::string& key, const std::string&, const std::string&) {
  throw Error(ErrorCode::Unsupported, "compare_set(\"" + key +
                                          "\"): this store does not implement it (a Store of your own: override "
                                          "compare_set to let communicators on it shrink)");
}

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  BRAID_CHECK(base_ != nullptr, InvalidUsage,
              "PrefixStore(\"" << prefix_ << "\"): base store is null");
  prefix_ += '/';
}

PrefixStore::~PrefixStore() = default;

void PrefixStore::set(const std::string& key, const std::string& value) {
  base_->set(prefix_ + key, value);
}

std::string PrefixStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  return base_->get(prefix_ + key, timeout);
}

std::int64_t PrefixStore::add(const std::string& key, std::int64_t delta) {
  return base_->add(prefix_ + key, delta);
}

namespace {
std::vector<std::string> prefixed(const std::string& prefix, const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(prefix + k);
  return out;
}
}  // namespace

bool PrefixStore::check(const std::vector<std::string>& keys) {
  return base_->check(prefixed(prefix_, keys));
}

void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  base_->wait(prefixed(prefix_, keys), timeout);
}

bool PrefixStore::remove(const std::string& key) { return base_->remove(prefix_ + key); }

std::string PrefixStore::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  return base_->compare_set(prefix_ + key, expected, desired);
}

}  // namespace braid
