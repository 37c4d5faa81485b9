#include "core/store_wire.hpp"

namespace braid::core::store_wire {

bool decode_request(const char* p, std::size_t n, Request* out) {
  Decoder d(p, n);
  Request r;
  r.op = d.u8();
  r.id = d.u32();
  switch (r.op) {
    case kSet:
      r.key = d.str(kMaxKey);
      r.value = d.str(kMaxValue);
      break;
    case kGet:
      r.key = d.str(kMaxKey);
      r.timeout_ms = d.u64();
      break;
    case kAdd:
      r.key = d.str(kMaxKey);
      r.delta = static_cast<std::int64_t>(d.u64());
      break;
    case kCheck:
      r.keys = d.keys();
      break;
    case kWait:
      r.keys = d.keys();
      r.timeout_ms = d.u64();
      break;
    case kRemove:
      r.key = d.str(kMaxKey);
      break;
    case kCompareSet:
      r.key = d.str(kMaxKey);
      r.expected = d.str(kMaxValue);
      r.value = d.str(kMaxValue);
      break;
    default:
      return false;
  }
  if (!d.at_end()) return false;
  *out = std::move(r);
  return true;
}

std::size_t take_replies(const std::string& in, std::vector<std::pair<std::uint32_t, Reply>>* got,
                         std::string* err) {
  std::size_t off = 0;
  for (;;) {
    std::uint64_t len = 0;
    const Frame f = frame_at(in.data() + off, in.size() - off, kReplyHead, &len);
    if (f == Frame::bad) *err = "malformed reply (frame length " + std::to_string(len) + ")";
    if (f != Frame::complete) break;
    const char* p = in.data() + off + 4;
    Reply rep;
    rep.done = true;
    rep.status = static_cast<std::uint8_t>(p[0]);
    auto id = static_cast<std::uint32_t>(load_le(p + 1, 4));
    rep.payload.assign(p + kReplyHead, len - kReplyHead);
    got->emplace_back(id, std::move(rep));
    off += 4 + len;
  }
  return off;
}

bool reply_value(const std::string& payload, std::string* value) {
  Decoder d(payload.data(), payload.size());
  *value = d.str(kMaxValue);
  return d.at_end();
}

bool reply_int(const std::string& payload, std::int64_t* value) {
  Decoder d(payload.data(), payload.size());
  *value = static_cast<std::int64_t>(d.u64());
  return d.at_end();
}

bool reply_flag(const std::string& payload, bool* flag) {
  if (payload.size() != 1) return false;
  *flag = payload[0] != 0;
  return true;
}

bool reply_missing(const std::string& payload, std::vector<std::string>* keys) {
  Decoder d(payload.data(), payload.size());
  *keys = d.keys();
  return d.at_end();
}

std::string reply_error(const std::string& payload) {
  Decoder d(payload.data(), payload.size());
  return d.str(kMaxFrame);
}

Hello parse_hello(const char* p, std::size_t avail, bool* has_token, std::string* nonce, std::size_t* used,
                  unsigned* version) {
  if (avail >= 4 && load_le(p, 4) != kMagic) return Hello::not_a_store;
  if (avail < kHelloSize) return Hello::more;
  *version = static_cast<unsigned>(load_le(p + 4, 2));
  if (*version != kVersion) return Hello::version;
  const std::uint64_t flags = load_le(p + 6, 2);
  if ((flags & ~std::uint64_t{kHasToken}) != 0) return Hello::bad_flags;
  if (avail < kClientHelloSize) return Hello::more;
  *has_token = (flags & kHasToken) != 0;
  nonce->assign(p + kHelloSize, base::auth::kNonceBytes);
  *used = kClientHelloSize;
  return Hello::ok;
}

}  // namespace braid::core::store_wire
