// Command-line helpers shared by allreduce_bench, mpi_allreduce_bench and braid_sim,
// so that all three read sizes the same way (nccl-tests style).
#pragma once

#include <CLI/CLI.hpp>

#include <cctype>
#include <cstdint>
#include <string>

namespace braid::bench {

/// "1024", "64K", "8M", "1G" (binary multiples) -> bytes. Throws CLI::ValidationError
/// with the accepted forms on anything else.
inline std::uint64_t parse_size(const std::string& s) {
  const auto bad = [&] { return CLI::ValidationError("size", "'" + s + "' is not a size like 1024, 64K, 8M, 1G"); };
  if (s.empty()) throw bad();
  std::uint64_t mult = 1;
  std::string d = s;
  switch (std::toupper(static_cast<unsigned char>(d.back()))) {
    case 'K': mult = 1ull << 10; d.pop_back(); break;
    case 'M': mult = 1ull << 20; d.pop_back(); break;
    case 'G': mult = 1ull << 30; d.pop_back(); break;
    default: break;
  }
  if (d.empty() || d.find_first_not_of("0123456789") != std::string::npos || d.size() > 15) throw bad();
  return std::stoull(d) * mult;
}

}  // namespace braid::bench
