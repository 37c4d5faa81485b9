// FileStore records: the input is a store file as some other process left it (a header and
// records, or raw bytes), read and appended to through the real FileStore: open (which
// validates the header and cuts off a torn tail), check and get (which parse the records),
// then add and set (which append after what was parsed).
#include "fuzz_common.hpp"

#include <braid/error.hpp>
#include <braid/store.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>

namespace {
/// This process's store file, removed when it exits.
struct StoreFile {
  std::string path;
  StoreFile() {
    const char* dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    path = std::string(dir) + "/braid-fuzz-file-store-" + std::to_string(::getpid());
  }
  ~StoreFile() { ::unlink(path.c_str()); }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const StoreFile store_file;
  const std::string& path = store_file.path;
  std::string file;
  if (size > 0 && (data[0] & 1)) {
    file.assign(reinterpret_cast<const char*>(data) + 1, size - 1);  // raw bytes
  } else {
    file = "BRAIDFS1fuzzfuzz";  // a valid header, then the input as records
    if (size > 0) file.append(reinterpret_cast<const char*>(data) + 1, size - 1);
  }
  {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) std::abort();
    std::size_t done = 0;
    while (done < file.size()) {
      const ssize_t r = ::write(fd, file.data() + done, file.size() - done);
      if (r <= 0) std::abort();
      done += static_cast<std::size_t>(r);
    }
    ::close(fd);
  }
  try {
    braid::FileStore store(path);
    (void)store.check({"a", "b"});
    try {
      (void)store.get("a", std::chrono::milliseconds(0));
    } catch (const braid::TimeoutError&) {
    }
    try {
      (void)store.add("n", 1);
    } catch (const braid::Error& e) {
      FUZZ_CHECK(e.code() == braid::ErrorCode::InvalidUsage);  // "n" held something not a number
    }
    store.set("z", "after");
    FUZZ_CHECK(store.get("z", std::chrono::milliseconds(0)) == "after");
  } catch (const braid::Error&) {
    // Not a store file, or a corrupt record: refused with a message.
  }
  return 0;
}
