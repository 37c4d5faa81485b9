// ErrorFeedbackStore and its checkpoint format (docs/codecs.md):
//   "BRAIDEF\0" (8 bytes) | u32 version = 2 | u32 entry count |
//   per entry: u32 key length | key bytes | u8 role | u64 count | count x f32 |
//   u32 step count | per step: u32 key length | key bytes | u64 step |   (version 2 only)
//   u64 FNV-1a 64 of every preceding byte.
// Version 1 (no step counters) is still read.
// All integers and floats little-endian.
#include "compression/error_feedback.hpp"

#include <braid/error.hpp>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <istream>
#include <ostream>

namespace braid::compression {
namespace {

constexpr char kMagic[8] = {'B', 'R', 'A', 'I', 'D', 'E', 'F', '\0'};
constexpr std::uint32_t kVersion = 2;
constexpr std::uint64_t kMaxKeyBytes = 1 << 16;

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

const char* role_name(ResidualRole r) { return r == ResidualRole::worker ? "worker" : "owner"; }

struct Writer {
  std::ostream& os;
  std::uint64_t h = 0xcbf29ce484222325ull;
  void bytes(const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
    os.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
  }
  template <class T>
  void le(T v) {
    unsigned char b[sizeof(T)];
    for (std::size_t i = 0; i < sizeof(T); ++i) b[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(v) >> (8 * i));
    bytes(b, sizeof b);
  }
};

struct Reader {
  std::istream& is;
  std::uint64_t h = 0xcbf29ce484222325ull;
  void bytes(void* p, std::size_t n) {
    is.read(static_cast<char*>(p), static_cast<std::streamsize>(n));
    if (static_cast<std::size_t>(is.gcount()) != n)
      throw Error(ErrorCode::InvalidUsage, "error-feedback checkpoint is truncated");
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  }
  template <class T>
  T le() {
    unsigned char b[sizeof(T)];
    bytes(b, sizeof b);
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<std::uint64_t>(b[i]) << (8 * i);
    return static_cast<T>(v);
  }
};

}  // namespace

float* ErrorFeedbackStore::residual(const std::string& key, ResidualRole role, std::size_t count) {
  if (key.empty())
    throw Error(ErrorCode::InvalidUsage, "error feedback needs a bucket key: set the per-call error-feedback key");
  std::lock_guard<std::mutex> lock(mu_);
  auto it = buffers_.find(Key{key, role});
  if (it == buffers_.end()) {
    it = buffers_.emplace(Key{key, role}, std::vector<float>(count, 0.0f)).first;
  } else if (it->second.size() != count) {
    throw Error(ErrorCode::InvalidUsage,
                "error-feedback key '" + key + "' (" + role_name(role) + " residual) holds " +
                    std::to_string(it->second.size()) + " values but this call has " + std::to_string(count) +
                    "; use one key per bucket, or reset the key when the bucket changes size");
  }
  return it->second.data();
}

bool ErrorFeedbackStore::contains(const std::string& key, ResidualRole role) const {
  std::lock_guard<std::mutex> lock(mu_);
  return buffers_.count(Key{key, role}) != 0;
}

void ErrorFeedbackStore::reset(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  buffers_.erase(Key{key, ResidualRole::worker});
  buffers_.erase(Key{key, ResidualRole::owner});
}

void ErrorFeedbackStore::reset_all() {
  std::lock_guard<std::mutex> lock(mu_);
  buffers_.clear();
}

void ErrorFeedbackStore::reset_role(ResidualRole role) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = buffers_.begin(); it != buffers_.end();) it = it->first.second == role ? buffers_.erase(it) : std::next(it);
}

std::uint64_t ErrorFeedbackStore::next_step(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return steps_[key]++;
}

std::size_t ErrorFeedbackStore::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t b = 0;
  for (const auto& kv : buffers_) b += kv.second.size() * sizeof(float);
  return b;
}

std::size_t ErrorFeedbackStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return buffers_.size();
}

void ErrorFeedbackStore::save(std::ostream& os, const std::string& prefix) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<const std::map<Key, std::vector<float>>::value_type*> chosen;
  for (const auto& kv : buffers_) {
    if (!starts_with(kv.first.first, prefix)) continue;
    if (kv.first.first.size() == prefix.size())
      throw Error(ErrorCode::InvalidUsage, "error-feedback key '" + prefix +
                                               "' equals the checkpoint prefix; give the prefix a separator "
                                               "('" + prefix + "/') or save without a prefix");
    chosen.push_back(&kv);
  }
  std::vector<std::pair<std::string, std::uint64_t>> steps;
  for (const auto& kv : steps_) {
    if (kv.first.empty() || !starts_with(kv.first, prefix)) continue;
    if (kv.first.size() == prefix.size()) continue;  // only calls under the bare prefix: no key to name it by
    steps.emplace_back(kv.first.substr(prefix.size()), kv.second);
  }
  Writer w{os};
  w.bytes(kMagic, sizeof kMagic);
  w.le<std::uint32_t>(kVersion);
  w.le<std::uint32_t>(static_cast<std::uint32_t>(chosen.size()));
  for (const auto* kv : chosen) {
    const std::string key = kv->first.first.substr(prefix.size());
    w.le<std::uint32_t>(static_cast<std::uint32_t>(key.size()));
    w.bytes(key.data(), key.size());
    w.le<std::uint8_t>(static_cast<std::uint8_t>(kv->first.second));
    w.le<std::uint64_t>(kv->second.size());
    for (float f : kv->second) {
      std::uint32_t u;
      std::memcpy(&u, &f, 4);
      w.le<std::uint32_t>(u);
    }
  }
  w.le<std::uint32_t>(static_cast<std::uint32_t>(steps.size()));
  for (const auto& [key, step] : steps) {
    w.le<std::uint32_t>(static_cast<std::uint32_t>(key.size()));
    w.bytes(key.data(), key.size());
    w.le<std::uint64_t>(step);
  }
  const std::uint64_t h = w.h;
  w.le<std::uint64_t>(h);
  if (!os) throw Error(ErrorCode::System, "writing the error-feedback checkpoint failed (stream error)");
}

void ErrorFeedbackStore::restore(std::istream& is, const std::string& prefix) {
  Reader r{is};
  char magic[8];
  r.bytes(magic, sizeof magic);
  if (std::memcmp(magic, kMagic, sizeof magic) != 0)
    throw Error(ErrorCode::InvalidUsage, "not an error-feedback checkpoint (bad magic; expected one written by "
                                         "ErrorFeedbackStore::save)");
  const auto version = r.le<std::uint32_t>();
  if (version != 1 && version != kVersion)
    throw Error(ErrorCode::InvalidUsage, "error-feedback checkpoint version " + std::to_string(version) +
                                             " is not supported (this build reads versions 1 and 2)");
  const auto read_key = [&r] {
    const auto klen = r.le<std::uint32_t>();
    if (klen == 0 || klen > kMaxKeyBytes)
      throw Error(ErrorCode::InvalidUsage, "error-feedback checkpoint: bad key length " + std::to_string(klen));
    std::string key(klen, '\0');
    r.bytes(key.data(), klen);
    return key;
  };
  const auto n = r.le<std::uint32_t>();
  std::map<Key, std::vector<float>> fresh;
  for (std::uint32_t e = 0; e < n; ++e) {
    const std::string key = read_key();
    const auto role = r.le<std::uint8_t>();
    if (role > 1) throw Error(ErrorCode::InvalidUsage, "error-feedback checkpoint: bad role " + std::to_string(role));
    const auto count = r.le<std::uint64_t>();
    std::vector<float> data;
    // Read in pieces so a corrupt count fails on truncation instead of a huge allocation.
    constexpr std::uint64_t kPiece = 1 << 16;
    for (std::uint64_t done = 0; done < count;) {
      const std::uint64_t m = std::min(kPiece, count - done);
      const std::size_t old = data.size();
      data.resize(old + m);
      r.bytes(data.data() + old, m * 4);
      done += m;
    }
    if (!fresh.emplace(Key{prefix + key, static_cast<ResidualRole>(role)}, std::move(data)).second)
      throw Error(ErrorCode::InvalidUsage, "error-feedback checkpoint: key '" + key + "' appears twice");
  }
  std::map<std::string, std::uint64_t> fresh_steps;
  if (version >= 2) {
    const auto m = r.le<std::uint32_t>();
    for (std::uint32_t e = 0; e < m; ++e) {
      const std::string key = read_key();
      const auto step = r.le<std::uint64_t>();
      if (!fresh_steps.emplace(prefix + key, step).second)
        throw Error(ErrorCode::InvalidUsage, "error-feedback checkpoint: step of key '" + key + "' appears twice");
    }
  }
  const std::uint64_t expect = r.h;
  const auto sum = r.le<std::uint64_t>();
  if (sum != expect) throw Error(ErrorCode::InvalidUsage, "error-feedback checkpoint: checksum mismatch (corrupt)");
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = buffers_.begin(); it != buffers_.end();)
    it = starts_with(it->first.first, prefix) ? buffers_.erase(it) : std::next(it);
  buffers_.merge(fresh);
  for (auto it = steps_.begin(); it != steps_.end();)
    it = !it->first.empty() && starts_with(it->first, prefix) ? steps_.erase(it) : std::next(it);
  steps_.merge(fresh_steps);
}

}  // namespace braid::compression
