// The TcpStore server's side of the protocol: a client connection's bytes through the hello
// (store_wire::parse_hello: flags and nonce, then a proof when it has a token), the framing (store_wire::frame_at) and the request decoder
// (store_wire::decode_request), as TcpStoreServer's process_input and handle read them.
#include "fuzz_common.hpp"

#include "core/store_wire.hpp"

namespace sw = braid::core::store_wire;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const char* p = reinterpret_cast<const char*>(data);
  std::size_t avail = size;
  // The hello: half of the inputs skip it, so that the fuzzer reaches the requests.
  if (avail > 0 && (data[0] & 1)) {
    ++p;
    --avail;
  } else {
    bool has_token = false;
    std::string nonce;
    std::size_t used = 0;
    unsigned version = 0;
    if (sw::parse_hello(p, avail, &has_token, &nonce, &used, &version) != sw::Hello::ok) return 0;
    FUZZ_CHECK(nonce.size() == braid::base::auth::kNonceBytes && used == sw::kClientHelloSize && used <= avail);
    // With a token the client's proof follows (kClientProofSize bytes, compared, never parsed).
    if (has_token) {
      if (avail - used < sw::kClientProofSize) return 0;
      used += sw::kClientProofSize;
    }
    p += used;
    avail -= used;
  }
  for (;;) {
    std::uint64_t len = 0;
    const sw::Frame f = sw::frame_at(p, avail, 1, &len);
    if (f != sw::Frame::complete) return 0;  // more bytes to wait for, or the client is dropped
    FUZZ_CHECK(len >= 1 && len <= sw::kMaxFrame && len <= avail - 4);
    sw::Request q;
    if (!sw::decode_request(p + 4, len, &q)) return 0;  // malformed: the client is dropped
    FUZZ_CHECK(q.op >= sw::kSet && q.op <= sw::kCompareSet);
    FUZZ_CHECK(q.key.size() <= sw::kMaxKey && q.value.size() <= sw::kMaxValue);
    FUZZ_CHECK(q.keys.size() <= sw::kMaxKeysPerRequest);
    std::size_t fields = 5 + (q.op == sw::kCheck || q.op == sw::kWait ? 4 : 4 + q.key.size());
    for (const auto& k : q.keys) {
      FUZZ_CHECK(k.size() <= sw::kMaxKey);
      fields += 4 + k.size();
    }
    FUZZ_CHECK(q.expected.size() <= sw::kMaxValue);
    if (q.op == sw::kSet) fields += 4 + q.value.size();
    if (q.op == sw::kCompareSet) fields += 4 + q.expected.size() + 4 + q.value.size();
    if (q.op == sw::kGet || q.op == sw::kAdd || q.op == sw::kWait) fields += 8;
    FUZZ_CHECK(fields == len);  // every byte of the frame is accounted for
    p += 4 + len;
    avail -= 4 + len;
  }
}
