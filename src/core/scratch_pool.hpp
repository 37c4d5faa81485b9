// A pool of host scratch buffers: a buffer goes back to the pool when its lease is dropped,
// from whichever thread drops it, and the pool keeps the two largest it was given back, so
// that a call of the size of the last ones allocates nothing.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace braid::core {

/// Scratch buffers of finished operations (Engine::scratch_pool_) and the f32 copies of
/// 16-bit compressed calls (Compressor). Leases return their buffer when the operation is
/// gone, from whichever thread drops it.
class ScratchPool : public std::enable_shared_from_this<ScratchPool> {
 public:
  struct Buf {
    std::unique_ptr<std::byte[]> data;
    std::size_t size = 0;
  };
  class Lease {
   public:
    Lease() = default;
    Lease(std::shared_ptr<ScratchPool> pool, Buf buf) : pool_(std::move(pool)), buf_(std::move(buf)) {}
    Lease(Lease&&) noexcept = default;
    Lease& operator=(Lease&& o) noexcept {
      give_back();
      pool_ = std::move(o.pool_);
      buf_ = std::move(o.buf_);
      return *this;
    }
    ~Lease() { give_back(); }
    std::byte* data() const noexcept { return buf_.data.get(); }

   private:
    void give_back() noexcept {
      if (pool_ && buf_.data) pool_->put(std::move(buf_));
      pool_.reset();
    }
    std::shared_ptr<ScratchPool> pool_;
    Buf buf_;
  };

  /// A buffer of at least `bytes` (uninitialized; none for 0).
  Lease take(std::size_t bytes) {
    if (bytes == 0) return {};
    Buf b;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // The smallest free buffer that fits; else replace the largest.
      std::size_t best = free_.size();
      for (std::size_t i = 0; i < free_.size(); ++i)
        if (free_[i].size >= bytes && (best == free_.size() || free_[i].size < free_[best].size)) best = i;
      if (best < free_.size()) {
        b = std::move(free_[best]);
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
      }
    }
    if (!b.data) {
      b.data.reset(new std::byte[bytes]);
      b.size = bytes;
    }
    return Lease(shared_from_this(), std::move(b));
  }

 private:
  static constexpr std::size_t kKeep = 2;  // typical: one operation in flight, one next
  void put(Buf b) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.size() >= kKeep) {
      auto smallest = std::min_element(free_.begin(), free_.end(),
                                       [](const Buf& x, const Buf& y) { return x.size < y.size; });
      if (smallest->size >= b.size) return;  // drop the new one
      *smallest = std::move(b);
      return;
    }
    free_.push_back(std::move(b));
  }
  std::mutex mu_;
  std::vector<Buf> free_;
};

}  // namespace braid::core
