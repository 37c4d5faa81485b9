// A memory registration cache for the verbs transport (the idea of NCCL's reg.cc):
// ibv_reg_mr pins pages and costs tens of microseconds to milliseconds, so a buffer that a
// job sends from again and again is registered once. Registrations are page-aligned; one that
// covers a request is reused; a new range that overlaps unused registrations replaces them
// by one covering the union (so a buffer that grows, or neighbours, end up in one entry
// rather than in a pile of overlapping ones); unused entries beyond a bound are deregistered,
// least recently used first; memory about to be freed is invalidated (its pages may come
// back at the same address with other physical pages, which an old registration would
// still point at).
//
// Verbs-free: the register and deregister callbacks make the verbs calls, so the policy is
// tested alone. Not thread-safe: one progress thread owns it. Lookups are linear in the
// number of entries (in use + at most max_unused), which a transport keeps to tens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace braid::transport::ibverbs {

struct Registration {
  void* handle = nullptr;  ///< the ibv_mr*
  std::uint32_t lkey = 0, rkey = 0;
  std::uintptr_t base = 0;  ///< page-aligned
  std::size_t bytes = 0;    ///< a multiple of the page
};

class RegCache {
 public:
  /// Registers [base, base+bytes) into *out (handle, lkey, rkey; the cache sets base and
  /// bytes); false with *why on failure. May throw: the cache is then unchanged.
  using RegisterFn = std::function<bool(std::uintptr_t base, std::size_t bytes, Registration* out, std::string* why)>;
  /// Deregisters one registration. Should not throw (it runs in the destructor too).
  using DeregisterFn = std::function<void(const Registration&)>;

  /// `page`: the alignment of every registration, a power of two (else braid::Error,
  /// InvalidUsage). `max_unused`: how many unused registrations stay cached.
  RegCache(RegisterFn reg, DeregisterFn dereg, std::size_t max_unused = 64, std::size_t page = 4096);
  ~RegCache();  ///< deregisters everything (in-use entries too; the owner is closing)
  RegCache(const RegCache&) = delete;
  RegCache& operator=(const RegCache&) = delete;

  /// A registration covering [addr, addr+bytes) (page-aligned outward; 0 bytes counts as
  /// one), its use count +1; an existing one that covers it is reused. When a new range
  /// overlaps unused entries, they are replaced by one covering the union (deregistered only
  /// once the union is registered). Null with *why when the register callback fails or the
  /// range wraps around the address space. The pointer stays valid until its last release
  /// (or the cache's destruction).
  const Registration* acquire(const void* addr, std::size_t bytes, std::string* why);
  /// Use count -1; unused entries beyond max_unused are deregistered, LRU first; a stale one
  /// (invalidated while in use) is deregistered at its last release. braid::Error
  /// (InvalidUsage) for a pointer this cache did not hand out or that is not in use.
  void release(const Registration* r);
  /// Deregisters unused entries overlapping the range (memory about to be freed); in-use ones
  /// are marked stale (never handed out again) and deregistered at their last release.
  /// Returns how many were dropped now.
  std::size_t invalidate(const void* addr, std::size_t bytes);

  std::size_t entries() const;  ///< every registration held, stale in-use ones included
  std::size_t in_use() const;   ///< those with a use count above 0

 private:
  struct Entry {
    Registration reg;
    std::size_t uses = 0;
    bool stale = false;
    std::uint64_t last_used = 0;  ///< tick of the last acquire or release
  };
  void drop(std::size_t i);  ///< deregisters entries_[i] and removes it
  void trim();               ///< evicts unused entries beyond max_unused, LRU first
  std::size_t find(const Registration* r) const;

  RegisterFn reg_;
  DeregisterFn dereg_;
  std::size_t max_unused_;
  std::uintptr_t page_;
  std::uint64_t tick_ = 0;
  std::vector<std::unique_ptr<Entry>> entries_;  ///< unique_ptr: handed-out pointers stay put
};

}  // namespace braid::transport::ibverbs
