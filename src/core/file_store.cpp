// braid — FileStore: a key-value store kept in one file, for ranks that share a file
// system but not (or not yet) a network.
//
// File format (integers little-endian): a 16-byte header, "BRAIDFS1" and 8 random
// bytes that tell this file from a re-created one (inode numbers get reused), then
// records appended one after another:
//   u8 type ('S' set, 'R' remove), u32 key length, u32 value length, key, value
// ('R' has an empty value). The latest record for a key wins.
//
// Writers (set, add, remove) append under flock(LOCK_EX); readers take LOCK_SH and
// parse only the bytes appended since they last looked, so polling is cheap. The file
// is opened for every operation: a forked child would otherwise share the parent's
// open file description and with it the flock, and a file that was deleted and
// re-created (another header) is noticed and re-read from the start. Threads of one process
// also serialise on a mutex, since flock does not exclude users of one description.
// A record torn by a writer that died mid-append is cut off by the next writer. The
// file only grows: it is meant for bootstrap-sized traffic.
#include <braid/error.hpp>
#include <braid/store.hpp>

#include "base/fd.hpp"
#include "base/text.hpp"
#include "core/store_limits.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>
#include <utility>

namespace braid {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr char kMagic[] = "BRAIDFS1";
constexpr std::size_t kMagicSize = 8;
constexpr std::size_t kHeaderSize = 16;  // magic + 8 random bytes
constexpr std::size_t kRecordHead = 9;   // type + key length + value length
constexpr std::size_t kMaxKey = core::kMaxStoreKey;
constexpr std::size_t kMaxValue = core::kMaxStoreValue;
constexpr std::int64_t kMaxTimeoutMs = 10ll * 365 * 24 * 3600 * 1000;
constexpr milliseconds kFirstPoll{1}, kMaxPoll{50};

using base::errno_text;
using base::quote;
using base::quote_keys;
using Fd = base::UniqueFd;

Clock::time_point deadline_after(milliseconds timeout) {
  return Clock::now() + milliseconds(std::clamp<std::int64_t>(timeout.count(), 0, kMaxTimeoutMs));
}

using base::parse_int64;

std::uint32_t load_u32(const char* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

void put_u32(std::string& s, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

struct FileStore::Impl {
  std::string path;
  std::mutex mu;  // guards the cache below and serialises this process's threads
  bool have_id = false;
  dev_t dev = 0;
  ino_t ino = 0;
  std::string header;        // the header of the file `data` comes from
  std::uint64_t offset = 0;  // bytes of the file already applied to `data` (0: none)
  std::unordered_map<std::string, std::string> data;

  [[noreturn]] void fail(const std::string& what, int err) const {
    throw Error(ErrorCode::System, "FileStore " + path + ": " + what + ": " + errno_text(err));
  }

  /// Runs f(fd) with the file open, flock-ed and the cache up to date.
  template <typename F>
  auto locked(bool exclusive, F&& f) {
    std::lock_guard<std::mutex> lk(mu);
    Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    if (fd.get() < 0) fail("cannot open the store file", errno);
    while (::flock(fd.get(), exclusive ? LOCK_EX : LOCK_SH) != 0)
      if (errno != EINTR) fail("flock failed", errno);
    refresh(fd.get(), exclusive);
    return f(fd.get());
  }

  std::string read_at(int fd, std::uint64_t at, std::size_t n) const {
    std::string buf(n, '\0');
    std::size_t got = 0;
    while (got < n) {
      ssize_t r = ::pread(fd, &buf[got], n - got, static_cast<off_t>(at + got));
      if (r < 0) {
        if (errno == EINTR) continue;
        fail("read failed", errno);
      }
      if (r == 0) break;
      got += static_cast<std::size_t>(r);
    }
    buf.resize(got);
    return buf;
  }

  void write_at(int fd, std::uint64_t at, const std::string& bytes) const {
    std::size_t done = 0;
    while (done < bytes.size()) {
      ssize_t r =
          ::pwrite(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(at + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        int e = errno;
        if (::ftruncate(fd, static_cast<off_t>(at)) != 0) {
          // Leave the torn tail; the next writer cuts it off.
        }
        fail("write failed", e);
      }
      done += static_cast<std::size_t>(r);
    }
  }

  void refresh(int fd, bool exclusive) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) fail("fstat failed", errno);
    auto size = static_cast<std::uint64_t>(st.st_size);
    std::string head =
        read_at(fd, 0, static_cast<std::size_t>(std::min<std::uint64_t>(size, kHeaderSize)));
    if (!have_id || st.st_dev != dev || st.st_ino != ino || size < offset ||
        (offset > 0 && head != header)) {
      data.clear();  // another file, or rewritten: start over
      offset = 0;
      dev = st.st_dev;
      ino = st.st_ino;
      have_id = true;
    }
    if (offset == 0) {
      if (std::memcmp(head.data(), kMagic, std::min(head.size(), kMagicSize)) != 0)
        throw Error(ErrorCode::InvalidUsage,
                    "FileStore " + path + ": the file exists and is not a braid store file");
      if (head.size() < kHeaderSize) {
        if (!exclusive) return;  // empty so far (or a header being written)
        head.assign(kMagic, kMagicSize);
        std::random_device rd;
        for (int i = 0; i < 2; ++i) put_u32(head, rd());
        write_at(fd, 0, head);
        size = kHeaderSize;
      }
      header = head;
      offset = kHeaderSize;
    }
    if (size > offset) {
      std::string buf = read_at(fd, offset, static_cast<std::size_t>(size - offset));
      std::size_t pos = 0;
      while (buf.size() - pos >= kRecordHead) {
        const char* p = buf.data() + pos;
        char type = p[0];
        std::uint32_t klen = load_u32(p + 1), vlen = load_u32(p + 5);
        if ((type != 'S' && type != 'R') || klen > kMaxKey || vlen > kMaxValue ||
            (type == 'R' && vlen != 0)) {
          throw Error(ErrorCode::System, "FileStore " + path + ": corrupt record at byte " +
                                             std::to_string(offset + pos) +
                                             " (was the file written by something else?)");
        }
        if (buf.size() - pos - kRecordHead < std::size_t{klen} + vlen) break;  // torn tail
        std::string key(p + kRecordHead, klen);
        if (type == 'S') {
          data[std::move(key)].assign(p + kRecordHead + klen, vlen);
        } else {
          data.erase(key);
        }
        pos += kRecordHead + klen + vlen;
      }
      offset += pos;
    }
    if (exclusive && offset < size && ::ftruncate(fd, static_cast<off_t>(offset)) != 0)
      fail("cannot cut off a torn record", errno);
  }

  /// Appends one record; call inside locked(true, ...).
  void append(int fd, char type, const std::string& key, const std::string& value) {
    std::string rec;
    rec.reserve(kRecordHead + key.size() + value.size());
    rec.push_back(type);
    put_u32(rec, static_cast<std::uint32_t>(key.size()));
    put_u32(rec, static_cast<std::uint32_t>(value.size()));
    rec += key;
    rec += value;
    write_at(fd, offset, rec);
    offset += rec.size();
    if (type == 'S') {
      data[key] = value;
    } else {
      data.erase(key);
    }
  }

  void check_key(const std::string& key, const char* op) const { core::check_store_key("FileStore", path, key, op); }

  /// Polls `ready` (called under the lock) with growing sleeps until it is true or the
  /// deadline passes; returns whether it became true.
  template <typename F>
  bool poll_until(Clock::time_point deadline, F&& ready) {
    milliseconds sleep = kFirstPoll;
    for (;;) {
      if (locked(false, [&](int) { return ready(); })) return true;
      auto now = Clock::now();
      if (now >= deadline) return false;
      std::this_thread::sleep_for(std::min<Clock::duration>(sleep, deadline - now));
      sleep = std::min(sleep * 2, kMaxPoll);
    }
  }
};

FileStore::FileStore(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->locked(true, [](int) { return 0; });  // creates the file or validates its header
}

FileStore::~FileStore() = default;

void FileStore::set(const std::string& key, const std::string& value) {
  impl_->check_key(key, "set");
  core::check_store_value("FileStore", impl_->path, key, value);
  impl_->locked(true, [&](int fd) {
    impl_->append(fd, 'S', key, value);
    return 0;
  });
}

std::string FileStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  impl_->check_key(key, "get");
  std::string value;
  bool found = impl_->poll_until(deadline_after(timeout), [&] {
    auto it = impl_->data.find(key);
    if (it == impl_->data.end()) return false;
    value = it->second;
    return true;
  });
  if (!found)
    throw TimeoutError("FileStore " + impl_->path + ": get(" + quote(key) + ") timed out after " +
                       std::to_string(timeout.count()) + " ms: the key was not set");
  return value;
}

std::int64_t FileStore::add(const std::string& key, std::int64_t delta) {
  impl_->check_key(key, "add");
  return impl_->locked(true, [&](int fd) {
    std::int64_t value = 0;
    auto it = impl_->data.find(key);
    std::string what =
        "FileStore " + impl_->path + ": add(" + quote(key) + ", " + std::to_string(delta) + "): ";
    if (it != impl_->data.end() && !parse_int64(it->second, &value))
      throw Error(ErrorCode::InvalidUsage, what + "the current value is not a decimal integer");
    if (__builtin_add_overflow(value, delta, &value))
      throw Error(ErrorCode::InvalidUsage, what + "the result overflows int64");
    impl_->append(fd, 'S', key, std::to_string(value));
    return value;
  });
}

bool FileStore::check(const std::vector<std::string>& keys) {
  return impl_->locked(false, [&](int) {
    for (const auto& k : keys)
      if (!impl_->data.count(k)) return false;
    return true;
  });
}

void FileStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<std::string> missing;
  bool ok = impl_->poll_until(deadline_after(timeout), [&] {
    missing.clear();
    for (const auto& k : keys)
      if (!impl_->data.count(k)) missing.push_back(k);
    return missing.empty();
  });
  if (!ok)
    throw TimeoutError("FileStore " + impl_->path + ": wait timed out after " +
                       std::to_string(timeout.count()) +
                       " ms; keys not set: " + quote_keys(missing));
}

bool FileStore::remove(const std::string& key) {
  impl_->check_key(key, "remove");
  return impl_->locked(true, [&](int fd) {
    if (!impl_->data.count(key)) return false;
    impl_->append(fd, 'R', key, std::string());
    return true;
  });
}

std::string FileStore::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  impl_->check_key(key, "compare_set");
  core::check_store_value("FileStore", impl_->path, key, desired);
  return impl_->locked(true, [&](int fd) {
    auto it = impl_->data.find(key);
    if (it == impl_->data.end() ? expected.empty() : it->second == expected) impl_->append(fd, 'S', key, desired);
    it = impl_->data.find(key);
    return it == impl_->data.end() ? std::string() : it->second;
  });
}

}  // namespace braid
