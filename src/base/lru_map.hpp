// A map that keeps at most `capacity` entries and forgets the least recently used one
// when a new key comes: the plan cache and the tuner's tables, which a job that keeps
// making new shapes would otherwise grow without bound (tests/soak). Not thread-safe:
// its owners hold their own locks. Eviction depends only on the order of find() and
// insert() calls, so objects fed the same calls in the same order (every rank of a
// communicator, which issue the same collectives) forget the same keys.
#pragma once

#include <cstddef>
#include <list>
#include <map>
#include <utility>

namespace braid::base {

template <class K, class V>
class LruMap {
 public:
  /// `capacity` 0: nothing is kept (insert() does nothing).
  explicit LruMap(std::size_t capacity) : capacity_(capacity) {}

  /// The value of `key`, now the most recently used, or nullptr.
  V* find(const K& key) {
    const auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    order_.splice(order_.end(), order_, it->second.second);
    return &it->second.first;
  }
  /// Adds or replaces `key`'s value, as the most recently used; forgets the least recently
  /// used entry if that makes one too many. Returns the stored value (nullptr when the
  /// capacity is 0).
  V* insert(const K& key, V value) {
    if (capacity_ == 0) return nullptr;
    if (V* old = find(key)) {
      *old = std::move(value);
      return old;
    }
    if (map_.size() >= capacity_) {
      map_.erase(order_.front());
      order_.pop_front();
    }
    order_.push_back(key);
    auto it = map_.emplace(key, std::make_pair(std::move(value), std::prev(order_.end()))).first;
    return &it->second.first;
  }
  std::size_t size() const noexcept { return map_.size(); }
  std::size_t capacity() const noexcept { return capacity_; }

 private:
  std::size_t capacity_;
  std::list<K> order_;  ///< least recently used first
  std::map<K, std::pair<V, typename std::list<K>::iterator>> map_;
};

}  // namespace braid::base
