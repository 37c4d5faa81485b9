// The verbs transport's memory registration cache (ibv_reg_cache.hpp).
#include "transport/ibverbs/ibv_reg_cache.hpp"

#include "base/logging.hpp"

#include <braid/error.hpp>

#include <algorithm>
#include <exception>
#include <limits>
#include <sstream>
#include <utility>

namespace braid::transport::ibverbs {

namespace {

constexpr std::uintptr_t kMaxAddr = std::numeric_limits<std::uintptr_t>::max();

std::string hex(std::uintptr_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

}  // namespace

RegCache::RegCache(RegisterFn reg, DeregisterFn dereg, std::size_t max_unused, std::size_t page)
    : reg_(std::move(reg)), dereg_(std::move(dereg)), max_unused_(max_unused), page_(page) {
  if (page == 0 || (page & (page - 1)) != 0)
    throw Error(ErrorCode::InvalidUsage, "verbs registration cache: page size " + std::to_string(page) +
                                             " is not a power of two");
  if (!reg_ || !dereg_)
    throw Error(ErrorCode::InvalidUsage, "verbs registration cache: a register or deregister callback is empty");
}

RegCache::~RegCache() {
  for (auto& e : entries_) {
    // Destructors never throw: a failing deregistration is logged and the rest still go.
    try {
      dereg_(e->reg);
    } catch (const std::exception& ex) {
      BRAID_LOG(warn, "verbs registration cache: deregistering " << hex(e->reg.base) << " + " << e->reg.bytes
                                                                 << " bytes failed: " << ex.what());
    } catch (...) {
      BRAID_LOG(warn, "verbs registration cache: deregistering " << hex(e->reg.base) << " failed");
    }
  }
}

const Registration* RegCache::acquire(const void* addr, std::size_t bytes, std::string* why) {
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  const std::size_t len = bytes == 0 ? 1 : bytes;
  if (a > kMaxAddr - len || a + len > kMaxAddr - (page_ - 1)) {
    if (why != nullptr) *why = "cannot register " + hex(a) + " + " + std::to_string(bytes) + " bytes: the range wraps";
    return nullptr;
  }
  const std::uintptr_t lo = a & ~(page_ - 1);
  const std::uintptr_t hi = (a + len + page_ - 1) & ~(page_ - 1);
  for (auto& e : entries_) {
    if (!e->stale && e->reg.base <= lo && e->reg.base + e->reg.bytes >= hi) {
      ++e->uses;
      e->last_used = ++tick_;
      return &e->reg;
    }
  }
  // The union with the unused entries it overlaps, grown until nothing more overlaps it (a
  // merge can reach further entries). In-use ones stay as they are: their keys are in flight.
  std::uintptr_t ulo = lo, uhi = hi;
  std::vector<bool> merged(entries_.size(), false);
  for (bool grew = true; grew;) {
    grew = false;
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      const Entry& e = *entries_[i];
      if (merged[i] || e.uses != 0 || e.stale || e.reg.base >= uhi || ulo >= e.reg.base + e.reg.bytes) continue;
      merged[i] = true;
      grew = true;
      ulo = std::min(ulo, e.reg.base);
      uhi = std::max(uhi, e.reg.base + e.reg.bytes);
    }
  }
  Registration r;
  std::string err;
  if (!reg_(ulo, uhi - ulo, &r, &err)) {
    // The entries it would have replaced are still registered and still cached.
    if (why != nullptr)
      *why = "cannot register " + hex(ulo) + " + " + std::to_string(uhi - ulo) + " bytes" +
             (err.empty() ? std::string() : ": " + err);
    return nullptr;
  }
  r.base = ulo;
  r.bytes = uhi - ulo;
  auto e = std::make_unique<Entry>();
  e->reg = r;
  e->uses = 1;
  e->last_used = ++tick_;
  const Registration* got = &e->reg;
  // Held before the replaced ones go, so that a throwing deregistration leaks nothing.
  entries_.push_back(std::move(e));
  for (std::size_t i = merged.size(); i-- > 0;)
    if (merged[i]) drop(i);
  return got;
}

void RegCache::release(const Registration* r) {
  const std::size_t i = find(r);
  if (i == entries_.size() || entries_[i]->uses == 0)
    throw Error(ErrorCode::InvalidUsage, "verbs registration cache: release of a registration that is not in use");
  Entry& e = *entries_[i];
  --e.uses;
  e.last_used = ++tick_;
  if (e.uses != 0) return;
  if (e.stale)
    drop(i);
  else
    trim();
}

std::size_t RegCache::invalidate(const void* addr, std::size_t bytes) {
  if (bytes == 0) return 0;
  const auto lo = reinterpret_cast<std::uintptr_t>(addr);
  const std::uintptr_t hi = lo > kMaxAddr - bytes ? kMaxAddr : lo + bytes;
  std::size_t dropped = 0;
  for (std::size_t i = entries_.size(); i-- > 0;) {
    Entry& e = *entries_[i];
    if (e.reg.base >= hi || lo >= e.reg.base + e.reg.bytes) continue;
    if (e.uses == 0) {
      drop(i);
      ++dropped;
    } else {
      e.stale = true;
    }
  }
  return dropped;
}

std::size_t RegCache::entries() const { return entries_.size(); }

std::size_t RegCache::in_use() const {
  std::size_t n = 0;
  for (const auto& e : entries_) n += e->uses != 0 ? 1 : 0;
  return n;
}

void RegCache::drop(std::size_t i) {
  // Out of the table first: should the callback throw, the entry is not left half-gone.
  std::unique_ptr<Entry> e = std::move(entries_[i]);
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
  dereg_(e->reg);
}

void RegCache::trim() {
  std::size_t unused = 0;
  for (const auto& e : entries_) unused += e->uses == 0 ? 1 : 0;
  while (unused > max_unused_) {
    std::size_t oldest = entries_.size();
    for (std::size_t i = 0; i < entries_.size(); ++i)
      if (entries_[i]->uses == 0 && (oldest == entries_.size() || entries_[i]->last_used < entries_[oldest]->last_used))
        oldest = i;
    drop(oldest);
    --unused;
  }
}

std::size_t RegCache::find(const Registration* r) const {
  for (std::size_t i = 0; i < entries_.size(); ++i)
    if (&entries_[i]->reg == r) return i;
  return entries_.size();
}

}  // namespace braid::transport::ibverbs
