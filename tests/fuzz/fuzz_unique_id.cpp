// UniqueId bytes (Communicator::from_unique_id): 128 bytes handed over by MPI_Bcast, a
// file or a command line, through core::parse_unique_id.
#include "fuzz_common.hpp"

#include "core/unique_id.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  braid::UniqueId id;
  std::memcpy(id.bytes.data(), data, size < id.bytes.size() ? size : id.bytes.size());
  const auto f = braid::core::parse_unique_id(id);
  if (!f) return 0;
  FUZZ_CHECK(f->port > 0 && f->port < 65536 && !f->nonce.empty() && !f->addr.empty());
  FUZZ_CHECK(f->addr.size() + f->nonce.size() < id.bytes.size());
  return 0;
}
