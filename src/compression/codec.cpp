// Codec names and dispatch to the host kernels (src/kernels/host/codec_kernels.*).
#include "compression/codec.hpp"

#include "base/text.hpp"
#include "kernels/host/codec_kernels.hpp"

#include <braid/error.hpp>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <vector>

namespace braid::compression {
namespace {

namespace k = braid::kernels;

constexpr const char* kValid =
    "valid codecs: none, fp16, bf16, fp8e4m3, fp8e5m2, int8, int4, sign1, mxfp8, mxfp4, topk:RATIO "
    "(0 < RATIO <= 1), auto; options appended with ':': sr|rn (int8, int4), block=N (N a multiple of 8 in "
    "[8, 4096]; int8, int4, fp8e4m3, fp8e5m2, sign1), seed=N (int8:sr, int4:sr); e.g. int8:sr:block=128, "
    "topk:0.01 (docs/codecs.md)";

[[noreturn]] void bad(std::string_view text, const std::string& why) {
  std::ostringstream os;
  os << "codec '" << text << "': " << why << "; " << kValid;
  throw Error(ErrorCode::InvalidUsage, os.str());
}

struct NameKind {
  const char* name;
  CodecKind kind;
};
constexpr NameKind kNames[] = {{"none", CodecKind::none},       {"fp16", CodecKind::fp16},
                               {"bf16", CodecKind::bf16},       {"fp8e4m3", CodecKind::fp8e4m3},
                               {"fp8e5m2", CodecKind::fp8e5m2}, {"int8", CodecKind::int8},
                               {"int4", CodecKind::int4},       {"sign1", CodecKind::sign1},
                               {"mxfp8", CodecKind::mxfp8},     {"mxfp4", CodecKind::mxfp4},
                               {"topk", CodecKind::topk},       {"auto", CodecKind::automatic}};

// The block formats whose block size is an option (MX fixes it at 32).
bool is_block_kind(CodecKind kind) {
  return kind == CodecKind::int8 || kind == CodecKind::int4 || kind == CodecKind::fp8e4m3 ||
         kind == CodecKind::fp8e5m2 || kind == CodecKind::sign1;
}
bool is_mx_kind(CodecKind kind) { return kind == CodecKind::mxfp8 || kind == CodecKind::mxfp4; }
bool is_int_kind(CodecKind kind) { return kind == CodecKind::int8 || kind == CodecKind::int4; }

bool parse_u64(const std::string& s, std::uint64_t* v) {
  if (s.empty() || s.size() > 20) return false;
  std::uint64_t r = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    const std::uint64_t d = static_cast<std::uint64_t>(c - '0');
    if (r > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return false;
    r = r * 10 + d;
  }
  *v = r;
  return true;
}

std::string format_ratio(double r) {
  for (int prec = 1; prec <= 17; ++prec) {
    std::ostringstream os;
    os.precision(prec);
    os << r;
    if (std::strtod(os.str().c_str(), nullptr) == r) return os.str();
  }
  std::ostringstream os;
  os.precision(17);
  os << r;
  return os.str();
}

k::BlockFormat block_format(CodecKind kind) {
  switch (kind) {
    case CodecKind::int8: return k::BlockFormat::int8;
    case CodecKind::int4: return k::BlockFormat::int4;
    case CodecKind::fp8e4m3: return k::BlockFormat::fp8e4m3;
    case CodecKind::fp8e5m2: return k::BlockFormat::fp8e5m2;
    case CodecKind::mxfp8: return k::BlockFormat::mxfp8;
    case CodecKind::mxfp4: return k::BlockFormat::mxfp4;
    default: return k::BlockFormat::sign1;
  }
}

void check_encodable(const CodecSpec& spec, const char* what) {
  if (spec.kind == CodecKind::automatic)
    throw Error(ErrorCode::InvalidUsage, std::string(what) +
                                             ": codec 'auto' must be resolved to a concrete codec (by the "
                                             "communicator's cost model) before encoding");
  if (is_block_kind(spec.kind) &&
      (spec.block < 8 || spec.block > static_cast<int>(k::kMaxCodecBlock) || spec.block % 8 != 0)) {
    throw Error(ErrorCode::InvalidUsage, std::string(what) + ": block " + std::to_string(spec.block) +
                                             " is not a multiple of 8 in [8, 4096]");
  }
  if (is_mx_kind(spec.kind) && spec.block != kMxBlock)
    throw Error(ErrorCode::InvalidUsage, std::string(what) + ": " + (spec.kind == CodecKind::mxfp8 ? "mxfp8" : "mxfp4") +
                                             " has blocks of " + std::to_string(kMxBlock) + " values (OCP MX v1.0), not " +
                                             std::to_string(spec.block));
  if (spec.kind == CodecKind::topk && !(spec.topk_ratio > 0.0 && spec.topk_ratio <= 1.0))
    throw Error(ErrorCode::InvalidUsage, std::string(what) + ": topk ratio must be in (0, 1]");
}


// One encoder for the three entry points: value = in (+ add); residual optional.
void encode_impl(const CodecSpec& spec, const float* in, const float* add, std::size_t count, std::uint8_t* out,
                 float* residual, std::uint64_t step, std::uint64_t offset, const char* what) {
  check_encodable(spec, what);
  if (count == 0) return;
  switch (spec.kind) {
    case CodecKind::none:
      if (add) {
        for (std::size_t i = 0; i < count; ++i) {
          const float v = in[i] + add[i];
          std::memcpy(out + 4 * i, &v, 4);
        }
      } else {
        std::memcpy(out, in, 4 * count);
      }
      if (residual) std::memset(residual, 0, 4 * count);
      return;
    case CodecKind::fp16:
    case CodecKind::bf16:
      k::half_encode(spec.kind == CodecKind::fp16 ? k::HalfFormat::fp16 : k::HalfFormat::bf16, in, add, count, out,
                     residual);
      return;
    case CodecKind::topk: k::topk_encode(in, add, count, topk_k(spec, count), out, residual); return;
    default: k::block_encode(block_params(spec, step, offset), in, add, count, out, residual); return;
  }
}

void decode_impl(const CodecSpec& spec, const std::uint8_t* in, std::size_t count, float* out, bool acc) {
  check_encodable(spec, acc ? "decode_accumulate" : "decode");
  if (count == 0) return;
  switch (spec.kind) {
    case CodecKind::none:
      if (acc) {
        for (std::size_t i = 0; i < count; ++i) {
          float v;
          std::memcpy(&v, in + 4 * i, 4);
          out[i] += v;
        }
      } else {
        std::memcpy(out, in, 4 * count);
      }
      return;
    case CodecKind::fp16:
    case CodecKind::bf16:
      k::half_decode(spec.kind == CodecKind::fp16 ? k::HalfFormat::fp16 : k::HalfFormat::bf16, in, count, out, acc);
      return;
    case CodecKind::topk:
      if (!k::topk_decode(in, count, topk_k(spec, count), out, acc))
        throw Error(ErrorCode::Network, "topk payload of " + std::to_string(count) +
                                            " elements has an index out of range or out of order (corrupt or "
                                            "mismatched wire data: do all ranks use the same codec and count?)");
      return;
    default: k::block_decode(block_format(spec.kind), static_cast<std::uint32_t>(spec.block), in, count, out, acc);
      return;
  }
}

}  // namespace

kernels::BlockCodecParams block_params(const CodecSpec& spec, std::uint64_t step, std::uint64_t offset) {
  kernels::BlockCodecParams p;
  p.format = block_format(spec.kind);
  p.block = static_cast<std::uint32_t>(spec.block);
  p.stochastic = spec.rounding == Rounding::stochastic;
  p.seed = spec.seed;
  p.step = step;
  p.offset = offset;
  return p;
}

CodecSpec parse_codec(std::string_view text) {
  const std::string s = base::lower(text);
  std::vector<std::string> parts;
  {
    std::size_t start = 0;
    for (;;) {
      const std::size_t colon = s.find(':', start);
      parts.push_back(s.substr(start, colon == std::string::npos ? std::string::npos : colon - start));
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
  }
  CodecSpec spec;
  if (s.empty()) return spec;
  bool found = false;
  for (const auto& nk : kNames) {
    if (parts[0] == nk.name) {
      spec.kind = nk.kind;
      found = true;
    }
  }
  if (!found) bad(text, "unknown codec name '" + parts[0] + "'");
  if (is_mx_kind(spec.kind)) spec.block = kMxBlock;
  std::size_t next = 1;
  if (spec.kind == CodecKind::topk) {
    if (parts.size() < 2 || parts[1].empty()) bad(text, "topk needs a ratio, e.g. topk:0.01");
    char* end = nullptr;
    const double r = std::strtod(parts[1].c_str(), &end);
    if (end != parts[1].c_str() + parts[1].size() || !std::isfinite(r) || !(r > 0.0 && r <= 1.0))
      bad(text, "topk ratio '" + parts[1] + "' is not a number in (0, 1]");
    spec.topk_ratio = r;
    next = 2;
  }
  bool seen_round = false, seen_block = false, seen_seed = false;
  for (std::size_t i = next; i < parts.size(); ++i) {
    const std::string& o = parts[i];
    if (o == "sr" || o == "rn") {
      if (!is_int_kind(spec.kind)) bad(text, "option '" + o + "' applies to int8 and int4 only");
      if (seen_round) bad(text, "rounding given twice");
      seen_round = true;
      spec.rounding = o == "sr" ? Rounding::stochastic : Rounding::nearest;
    } else if (o.rfind("block=", 0) == 0) {
      if (is_mx_kind(spec.kind)) bad(text, "MX formats have blocks of 32 values by definition (OCP MX v1.0)");
      if (!is_block_kind(spec.kind)) bad(text, "option 'block=' applies to int8, int4, fp8e4m3, fp8e5m2, sign1 only");
      if (seen_block) bad(text, "block given twice");
      seen_block = true;
      std::uint64_t v = 0;
      if (!parse_u64(o.substr(6), &v) || v < 8 || v > k::kMaxCodecBlock || v % 8 != 0)
        bad(text, "block '" + o.substr(6) + "' is not a multiple of 8 in [8, 4096]");
      spec.block = static_cast<int>(v);
    } else if (o.rfind("seed=", 0) == 0) {
      if (!is_int_kind(spec.kind)) bad(text, "option 'seed=' applies to int8 and int4 only");
      if (seen_seed) bad(text, "seed given twice");
      seen_seed = true;
      if (!parse_u64(o.substr(5), &spec.seed)) bad(text, "seed '" + o.substr(5) + "' is not a decimal u64");
    } else {
      bad(text, "unknown option '" + o + "'");
    }
  }
  if (seen_seed && spec.rounding != Rounding::stochastic) bad(text, "seed= needs stochastic rounding (':sr')");
  return spec;
}

std::string name(const CodecSpec& spec) {
  std::string s;
  for (const auto& nk : kNames)
    if (nk.kind == spec.kind) s = nk.name;
  if (spec.kind == CodecKind::topk) s += ":" + format_ratio(spec.topk_ratio);
  if (is_int_kind(spec.kind) && spec.rounding == Rounding::stochastic) s += ":sr";
  if (is_block_kind(spec.kind) && spec.block != 256) s += ":block=" + std::to_string(spec.block);
  if (is_int_kind(spec.kind) && spec.rounding == Rounding::stochastic && spec.seed != 0)
    s += ":seed=" + std::to_string(spec.seed);
  return s;
}

bool requires_error_feedback(const CodecSpec& spec) noexcept {
  return spec.kind == CodecKind::sign1 || spec.kind == CodecKind::topk;
}

bool is_biased(const CodecSpec& spec) noexcept {
  if (spec.kind == CodecKind::none || spec.kind == CodecKind::automatic) return false;
  if (is_int_kind(spec.kind)) return spec.rounding == Rounding::nearest;
  return true;
}

double error_bound(const CodecSpec& spec) noexcept {
  const double sr = spec.rounding == Rounding::stochastic ? 2.0 : 1.0;
  switch (spec.kind) {
    case CodecKind::none: return 0.0;
    case CodecKind::fp16: return std::ldexp(1.0, -11);
    case CodecKind::bf16: return std::ldexp(1.0, -8);
    case CodecKind::fp8e4m3: return std::ldexp(1.0, -4);
    case CodecKind::fp8e5m2: return std::ldexp(1.0, -3);
    // A power-of-two scale leaves absmax / X in [256, 512) for E4M3 (largest 448) and
    // [4, 8) for E2M1 (largest 6): clamping costs up to 1/8 and 1/4 of the absmax.
    case CodecKind::mxfp8: return std::ldexp(1.0, -3);
    case CodecKind::mxfp4: return std::ldexp(1.0, -2);
    case CodecKind::int8: return sr / 254.0;
    case CodecKind::int4: return sr / 14.0;
    case CodecKind::sign1:
    case CodecKind::topk:
    case CodecKind::automatic: return 1.0;
  }
  return 1.0;
}

std::size_t topk_k(const CodecSpec& spec, std::size_t count) noexcept {
  if (count == 0) return 0;
  const double want = std::ceil(spec.topk_ratio * static_cast<double>(count));
  std::size_t kk = want >= static_cast<double>(count) ? count : static_cast<std::size_t>(want);
  return kk < 1 ? 1 : kk;
}

std::size_t encoded_bytes(const CodecSpec& spec, std::size_t count) {
  check_encodable(spec, "encoded_bytes");
  switch (spec.kind) {
    case CodecKind::none: return 4 * count;
    case CodecKind::fp16:
    case CodecKind::bf16: return k::half_payload_bytes(count);
    case CodecKind::topk: return k::topk_payload_bytes(topk_k(spec, count));
    default: return k::block_payload_bytes(block_format(spec.kind), static_cast<std::uint32_t>(spec.block), count);
  }
}

void encode(const CodecSpec& spec, const float* in, std::size_t count, std::uint8_t* out, std::uint64_t step,
            std::uint64_t offset) {
  encode_impl(spec, in, nullptr, count, out, nullptr, step, offset, "encode");
}

void encode_with_feedback(const CodecSpec& spec, const float* in, std::size_t count, std::uint8_t* out,
                          float* residual_out, std::uint64_t step, std::uint64_t offset) {
  encode_impl(spec, in, nullptr, count, out, residual_out, step, offset, "encode_with_feedback");
}

void encode_add_feedback(const CodecSpec& spec, const float* x, float* residual, std::size_t count,
                         std::uint8_t* out, std::uint64_t step, std::uint64_t offset) {
  encode_impl(spec, x, residual, count, out, residual, step, offset, "encode_add_feedback");
}

void decode(const CodecSpec& spec, const std::uint8_t* in, std::size_t count, float* out) {
  decode_impl(spec, in, count, out, false);
}

void decode_accumulate(const CodecSpec& spec, const std::uint8_t* in, std::size_t count, float* acc) {
  decode_impl(spec, in, count, acc, true);
}

}  // namespace braid::compression
