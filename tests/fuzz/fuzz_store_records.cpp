// Records ranks read from the shared store, written by another rank (or by anyone who can
// write the store): the communicator record "meta" (core::parse_meta), a split record
// (core::parse_split_record), rank 0's codec rates (core::parse_codec_rates) and a tcp
// peer's address (tcp_wire::parse_addr). Each must refuse what its writer could not have
// written and never crash, throw or allocate by a field.
#include "fuzz_common.hpp"

#include "core/communicator_impl.hpp"
#include "core/compressor.hpp"
#include "core/job_secret.hpp"
#include "transport/tcp/wire.hpp"

#include <cmath>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t which = data[0] % 4;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (which) {
    case 0: {
      if (const auto m = braid::core::parse_meta(text)) {
        FUZZ_CHECK(m->given ? m->token.empty() : m->token.size() == 32);
        const std::string again = braid::base::hex(m->comm_id) + (m->given ? "\ngiven" : "\ntoken " + m->token);
        FUZZ_CHECK(braid::core::parse_meta(again).has_value());
      }
      break;
    }
    case 1: {
      int color = -1, key = 0;
      if (braid::core::parse_split_record(text, &color, &key)) {
        FUZZ_CHECK(color >= 0);
        FUZZ_CHECK(text == std::to_string(color) + " " + std::to_string(key) || text.size() > 1);
      }
      break;
    }
    case 2: {
      std::vector<braid::compression::CodecRates> rates;
      std::string why;
      if (braid::core::parse_codec_rates(text, &rates, &why)) {
        FUZZ_CHECK(!rates.empty() && rates.size() <= 256);
        for (const auto& r : rates)
          FUZZ_CHECK(r.encode_Bps > 0 && r.decode_Bps > 0 && std::isfinite(r.encode_Bps) &&
                     std::isfinite(r.decode_Bps));
      } else {
        FUZZ_CHECK(!why.empty());
      }
      break;
    }
    default: {
      sockaddr_in a{};
      if (braid::transport::tcp_wire::parse_addr(text, &a)) FUZZ_CHECK(a.sin_family == AF_INET && a.sin_port != 0);
      break;
    }
  }
  return 0;
}
