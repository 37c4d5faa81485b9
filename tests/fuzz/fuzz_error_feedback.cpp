// The error-feedback checkpoint format (Communicator::restore_error_feedback, i.e.
// ErrorFeedbackStore::restore): a file of unknown origin. Half of the inputs get a valid
// checksum appended, so that the fuzzer gets past it to the records.
#include "fuzz_common.hpp"

#include "compression/error_feedback.hpp"

#include <braid/error.hpp>

#include <sstream>

namespace cz = braid::compression;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    // The format's checksum: FNV-1a 64 over everything before it, little-endian.
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char b : bytes) h = (h ^ b) * 0x100000001b3ull;
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>(h >> (8 * i)));
  }
  cz::ErrorFeedbackStore store;
  // Something to keep or replace: a failed restore must leave it as it was.
  store.residual("keep/a", cz::ResidualRole::worker, 3)[1] = 2.5f;
  const std::string prefix = (data[0] & 2) ? "keep/" : "";
  std::istringstream is(bytes);
  try {
    store.restore(is, prefix);
  } catch (const braid::Error&) {
    FUZZ_CHECK(store.contains("keep/a", cz::ResidualRole::worker));
    FUZZ_CHECK(store.residual("keep/a", cz::ResidualRole::worker, 3)[1] == 2.5f);
    return 0;
  }
  // What was accepted saves and restores to the same residuals (every key now lies under
  // the prefix: restore replaced those, and the store held no others).
  std::ostringstream os;
  store.save(os, prefix);
  std::istringstream back(os.str());
  cz::ErrorFeedbackStore again;
  again.restore(back, prefix);
  FUZZ_CHECK(again.size() == store.size() && again.bytes() == store.bytes());
  return 0;
}
