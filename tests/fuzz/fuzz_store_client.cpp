// The TcpStore client's side of the protocol: the server's bytes through the reply framing
// (store_wire::take_replies, as TcpStore's read_replies uses it) and each request's reply
// decoder (reply_value, reply_int, reply_flag, reply_missing, reply_error).
#include "fuzz_common.hpp"

#include "core/store_wire.hpp"

#include <utility>
#include <vector>

namespace sw = braid::core::store_wire;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::Input in(data, size);
  // Bytes arrive in pieces: each piece is appended and the complete frames taken, as the
  // reader does after every recv.
  std::string buffered;
  std::vector<std::pair<std::uint32_t, sw::Reply>> got;
  std::string err;
  while (in.left() > 0 && err.empty()) {
    const std::uint8_t* at = nullptr;
    const std::size_t k = in.take(1 + in.byte() * 16u, &at);
    buffered.append(reinterpret_cast<const char*>(at), k);
    const std::size_t used = sw::take_replies(buffered, &got, &err);
    FUZZ_CHECK(used <= buffered.size());
    buffered.erase(0, used);
  }
  for (const auto& [id, r] : got) {
    (void)id;
    FUZZ_CHECK(r.done && r.payload.size() + sw::kReplyHead <= sw::kMaxFrame);
    std::string value;
    if (sw::reply_value(r.payload, &value)) FUZZ_CHECK(value.size() + 4 == r.payload.size());
    std::int64_t n = 0;
    if (sw::reply_int(r.payload, &n)) FUZZ_CHECK(r.payload.size() == 8);
    bool flag = false;
    if (sw::reply_flag(r.payload, &flag)) FUZZ_CHECK(r.payload.size() == 1);
    std::vector<std::string> missing;
    if (sw::reply_missing(r.payload, &missing)) FUZZ_CHECK(missing.size() <= sw::kMaxKeysPerRequest);
    const std::string msg = sw::reply_error(r.payload);
    FUZZ_CHECK(msg.size() <= r.payload.size());
  }
  return 0;
}
