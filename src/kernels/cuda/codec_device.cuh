// Device side of the codecs (docs/codecs.md): the element recipes of
// src/kernels/host/codec_kernels.cpp ported operation for operation (IEEE f32 with
// explicit _rn intrinsics, no FMA), payload readers ("decoders") that yield eight
// consecutive values at a time, and the value sources an encoder reads from (plain
// in + add, or decode + local [+ residual] for the fused ring step).
#pragma once

#include "kernels/cuda/device_common.cuh"

namespace braid::kernels::cuda::detail {

constexpr std::uint32_t kNanBits = 0x7fc00000u;
constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
constexpr float kTinyAbsmax = 0x1p-100f;

BRAID_DEV float rne(float v) { return sub_rn(add_rn(v, kMagic), kMagic); }  // |v| <= 2^22, finite

// ---------------------------------------------------------------------------------------
// Philox4x32-10 (rng.hpp), keyed as docs/codecs.md "RNG".

BRAID_DEV uint4 philox(uint4 c, std::uint32_t k0, std::uint32_t k1) {
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const std::uint32_t hi0 = umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
    const std::uint32_t hi1 = umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
    c = make_uint4(hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0);
  }
  return c;
}
BRAID_DEV uint4 rounding_words(std::uint64_t seed, std::uint64_t step, std::uint64_t group) {
  return philox(make_uint4(static_cast<std::uint32_t>(group), static_cast<std::uint32_t>(group >> 32),
                           static_cast<std::uint32_t>(step), static_cast<std::uint32_t>(step >> 32)),
                static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
}
BRAID_DEV float uniform24(std::uint32_t w) { return static_cast<float>(w >> 8) * (1.0f / 16777216.0f); }

// u[j] for elements g0 .. g0+7, where g0 & 3 == OFF.
template <int OFF>
BRAID_DEV void uniforms8(std::uint64_t seed, std::uint64_t step, std::uint64_t g0, float (&u)[8]) {
  const std::uint64_t grp = g0 >> 2;
  const uint4 a = rounding_words(seed, step, grp), b = rounding_words(seed, step, grp + 1);
  uint4 c = make_uint4(0, 0, 0, 0);
  if constexpr (OFF != 0) c = rounding_words(seed, step, grp + 2);
  const std::uint32_t w[12] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w, c.x, c.y, c.z, c.w};
#pragma unroll
  for (int j = 0; j < 8; ++j) u[j] = uniform24(w[OFF + j]);
}

// ---------------------------------------------------------------------------------------
// fp8 (kernels/host/fp8.hpp Fp8<F>): the codecs' conversions and the f8e4m3/f8e5m2
// element types' (reduce.cu).

template <BlockFormat F>
struct Fp8 {
  static constexpr int kMbits = F == BlockFormat::fp8e4m3 ? 3 : 2;
  static constexpr int kBias = F == BlockFormat::fp8e4m3 ? 7 : 15;
  static constexpr std::uint32_t kMaxCode = F == BlockFormat::fp8e4m3 ? 0x7eu : 0x7bu;
  static constexpr float kMax = F == BlockFormat::fp8e4m3 ? 448.0f : 57344.0f;
  static constexpr float kSubScale = F == BlockFormat::fp8e4m3 ? 512.0f : 65536.0f;
  static constexpr float kSubStep = 1.0f / kSubScale;

  static BRAID_DEV std::uint32_t encode(float v) {
    const std::uint32_t u = f2u(v);
    const std::uint32_t sign = (u >> 24) & 0x80u;
    const std::uint32_t a = u & 0x7fffffffu;
    constexpr int kShift = 23 - kMbits;
    const std::uint32_t normal =
        (a - (static_cast<std::uint32_t>(127 - kBias) << 23) + ((1u << (kShift - 1)) - 1u) + ((a >> kShift) & 1u)) >>
        kShift;
    constexpr std::uint32_t kMinNormalBits = static_cast<std::uint32_t>(127 + 1 - kBias) << 23;
    const float as = u2f(a < kMinNormalBits ? a : kMinNormalBits);
    const std::uint32_t sub = static_cast<std::uint32_t>(static_cast<std::int32_t>(rne(fmul(as, kSubScale))));
    std::uint32_t r = a < kMinNormalBits ? sub : normal;
    r = r < kMaxCode ? r : kMaxCode;
    return r | sign;
  }
  // Any v: encode(), and NaN -> 0x7f (CUDA's satfinite conversion, fp8.hpp narrow).
  static BRAID_DEV std::uint32_t narrow(float v) {
    return (f2u(v) & 0x7fffffffu) > 0x7f800000u ? 0x7fu : encode(v);
  }
  static BRAID_DEV float decode(std::uint32_t code) {
    const std::uint32_t c = code & 0x7fu;
    const std::uint32_t sign = (code & 0x80u) << 24;
    const float normal = u2f((c << (23 - kMbits)) + (static_cast<std::uint32_t>(127 - kBias) << 23));
    const float sub = fmul(static_cast<float>(static_cast<std::int32_t>(c)), kSubStep);
    std::uint32_t r = (c >> kMbits) == 0 ? f2u(sub) : f2u(normal);
    if constexpr (F == BlockFormat::fp8e4m3) {
      r = c == 0x7fu ? kNanBits : r;
    } else {
      r = c >= 0x7cu ? (c == 0x7cu ? 0x7f800000u : kNanBits) : r;
    }
    return u2f(r | sign);
  }
};

template <BlockFormat F>
constexpr float kLevels = F == BlockFormat::int8 ? 127.0f : 7.0f;

// OCP MX (codec_kernels.cpp "OCP Microscaling"): an E8M0 byte per block, 2^k.
__host__ __device__ constexpr bool is_mx(BlockFormat f) { return f == BlockFormat::mxfp8 || f == BlockFormat::mxfp4; }
__host__ __device__ constexpr std::size_t scale_bytes(BlockFormat f) { return is_mx(f) ? 1 : 4; }
template <BlockFormat F>
constexpr int kMxEmax = F == BlockFormat::mxfp8 ? 8 : 2;
// 2^k for k in [-127, 127].
BRAID_DEV float pow2(int k) { return k >= -126 ? u2f(static_cast<std::uint32_t>(k + 127) << 23) : u2f(0x00400000u); }
BRAID_DEV float e8m0_value(std::uint32_t b) { return b == 0xffu ? u2f(kNanBits) : pow2(static_cast<int>(b) - 127); }
// E2M1: nearest, ties to the even code, clamped to 6; sign in bit 3.
BRAID_DEV std::uint32_t fp4_encode(float v) {
  const std::uint32_t u = f2u(v);
  const float a = u2f(u & 0x7fffffffu);
  const std::uint32_t c = (a > 0.25f ? 1u : 0u) + (a >= 0.75f ? 1u : 0u) + (a > 1.25f ? 1u : 0u) +
                          (a >= 1.75f ? 1u : 0u) + (a > 2.5f ? 1u : 0u) + (a >= 3.5f ? 1u : 0u) + (a > 5.0f ? 1u : 0u);
  return c | ((u >> 28) & 8u);
}
BRAID_DEV float fp4_decode(std::uint32_t c) {
  const std::uint32_t e = (c >> 1) & 3u, m = c & 1u;
  const float mag = e == 0 ? (m ? 0.5f : 0.0f) : u2f((e + 126u) << 23 | m << 22);
  return u2f(f2u(mag) | (c & 8u) << 28);
}

__host__ __device__ constexpr std::size_t codes_bytes(BlockFormat f, std::size_t n) {
  return f == BlockFormat::int4 || f == BlockFormat::mxfp4 ? (n + 1) / 2 : (f == BlockFormat::sign1 ? (n + 7) / 8 : n);
}

// ---------------------------------------------------------------------------------------
// Payload readers: load8(i, cnt, v) gives the decoded values of elements i .. i+7 (i a
// multiple of 8; cnt of them exist, the rest are +0).

// A block-format payload, or several laid end to end (compression/framed.hpp: frames of
// `frame` values, each a payload of its own with its scales first; the last may be
// shorter). frame 0: one payload. A frame is a multiple of the block, so a group of 8
// never straddles two frames.
template <BlockFormat F>
struct BlockDec {
  const std::uint8_t* payload;
  std::size_t nb;  // scale blocks of one frame (of the payload when frame is 0)
  std::uint32_t block;
  std::size_t frame = 0;        // values per frame; 0: one frame
  std::size_t frame_bytes = 0;  // payload bytes of a whole frame
  std::size_t last_frame = 0;   // index of the last frame
  std::size_t last_nb = 0;      // scale blocks of the last frame

  BRAID_DEV void load8(std::size_t i, int cnt, float (&v)[8]) const {
    const std::uint8_t* payload = this->payload;
    std::size_t nb = this->nb;
    if (frame != 0) {
      const std::size_t f = i / frame;
      i -= f * frame;
      payload += f * frame_bytes;
      if (f == last_frame) nb = last_nb;
    }
    const float s = is_mx(F) ? e8m0_value(payload[i / block]) : u2f(load_u32(payload + 4 * (i / block)));
    const std::uint8_t* codes = payload + scale_bytes(F) * nb;
    if constexpr (F == BlockFormat::sign1) {
      const std::uint32_t byte = codes[i / 8];
      const std::uint32_t m = f2u(s);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = j < cnt ? u2f(m ^ (((byte >> j) & 1u) << 31)) : 0.0f;
    } else if constexpr (F == BlockFormat::int4 || F == BlockFormat::mxfp4) {
      std::uint32_t w[1] = {0};
      if (cnt >= 8)
        load_bytes<4>(codes + i / 2, w);
      else
        for (int j = 0; j < (cnt + 1) / 2; ++j) w[0] |= static_cast<std::uint32_t>(codes[i / 2 + j]) << (8 * j);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const std::uint32_t nib = (w[0] >> (4 * j)) & 0xfu;
        float x;
        if constexpr (F == BlockFormat::mxfp4)
          x = fp4_decode(nib);
        else
          x = static_cast<float>(static_cast<int>(nib << 28) >> 28);
        v[j] = j < cnt ? fmul(x, s) : 0.0f;
      }
    } else {
      std::uint32_t w[2] = {0, 0};
      if (cnt >= 8)
        load_bytes<8>(codes + i, w);
      else
        for (int j = 0; j < cnt; ++j) w[j / 4] |= static_cast<std::uint32_t>(codes[i + j]) << (8 * (j % 4));
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const std::uint32_t c = (w[j / 4] >> (8 * (j % 4))) & 0xffu;
        float x;
        if constexpr (F == BlockFormat::int8)
          x = static_cast<float>(static_cast<std::int8_t>(c));
        else if constexpr (F == BlockFormat::mxfp8)
          x = Fp8<BlockFormat::fp8e4m3>::decode(c);
        else
          x = Fp8<F>::decode(c);
        v[j] = j < cnt ? fmul(x, s) : 0.0f;
      }
    }
  }
};

// fn(std::integral_constant<BlockFormat, format>{}): a block format as a compile-time
// constant, for the launchers' dispatch; kInvalidValue for a format that does not exist.
template <class Fn>
Status by_format(BlockFormat format, Fn&& fn) {
  using BF = BlockFormat;
  switch (format) {
    case BF::int8: return fn(std::integral_constant<BF, BF::int8>{});
    case BF::int4: return fn(std::integral_constant<BF, BF::int4>{});
    case BF::fp8e4m3: return fn(std::integral_constant<BF, BF::fp8e4m3>{});
    case BF::fp8e5m2: return fn(std::integral_constant<BF, BF::fp8e5m2>{});
    case BF::sign1: return fn(std::integral_constant<BF, BF::sign1>{});
    case BF::mxfp8: return fn(std::integral_constant<BF, BF::mxfp8>{});
    case BF::mxfp4: return fn(std::integral_constant<BF, BF::mxfp4>{});
  }
  return kInvalidValue;
}

// The reader of n values in frames of `frame` values (0, or at least n: one payload).
template <BlockFormat F>
BlockDec<F> block_dec(const std::uint8_t* payload, std::size_t n, std::uint32_t block, std::size_t frame) {
  BlockDec<F> d{payload, (n + block - 1) / block, block};
  if (frame != 0 && frame < n) {
    d.frame = frame;
    d.nb = frame / block;
    d.frame_bytes = block_payload_bytes(F, block, frame);
    d.last_frame = (n - 1) / frame;
    d.last_nb = (n - d.last_frame * frame + block - 1) / block;
  }
  return d;
}

// Element-wise formats: the code of one value and back.
struct RawFmt {
  static constexpr int kBytes = 4;
  static BRAID_DEV std::uint32_t enc(float f) { return f2u(f); }
  static BRAID_DEV float dec(std::uint32_t c) { return u2f(c); }
};
struct Fp16Fmt {
  static constexpr int kBytes = 2;
  static BRAID_DEV std::uint32_t enc(float f) { return f2h(f); }
  static BRAID_DEV float dec(std::uint32_t c) { return h2f(c); }
};
struct Bf16Fmt {
  static constexpr int kBytes = 2;
  static BRAID_DEV std::uint32_t enc(float f) { return f2bf(f); }
  static BRAID_DEV float dec(std::uint32_t c) { return bf2f(c); }
};

template <class Fmt>
struct ElemDec {
  const std::uint8_t* payload;

  BRAID_DEV void load8(std::size_t i, int cnt, float (&v)[8]) const {
    constexpr int K = Fmt::kBytes;
    std::uint32_t w[2 * K] = {};
    const std::uint8_t* p = payload + K * i;
    if (cnt >= 8)
      load_bytes<8 * K>(p, w);
    else
      for (int j = 0; j < K * cnt; ++j) w[j / 4] |= static_cast<std::uint32_t>(p[j]) << (8 * (j % 4));
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const std::uint32_t c = K == 4 ? w[j] : (w[j / 2] >> (16 * (j % 2))) & 0xffffu;
      v[j] = j < cnt ? Fmt::dec(c) : 0.0f;
    }
  }
};

// ---------------------------------------------------------------------------------------
// Value sources of the encoders. load8(i, cnt, y, acc): y = the value to encode, acc = the
// reduced value before the residual is added (fused only).

struct PlainSrc {
  static constexpr bool kFused = false;
  const float* in;
  const float* add;
  BRAID_DEV void load8(std::size_t i, int cnt, float (&y)[8], float (&)[8]) const {
    load8f(in + i, cnt, y);
    if (add) {
      float a[8];
      load8f(add + i, cnt, a);
#pragma unroll
      for (int j = 0; j < 8; ++j) y[j] = fadd(y[j], a[j]);
    }
  }
  BRAID_DEV void store_acc(std::size_t, int, const float (&)[8]) const {}
};

template <class Dec>
struct FusedSrc {
  static constexpr bool kFused = true;
  Dec dec;
  const float* local;
  const float* residual;  // read (error feedback) or nullptr
  float* acc_out;         // optional
  BRAID_DEV void load8(std::size_t i, int cnt, float (&y)[8], float (&acc)[8]) const {
    float d[8];
    dec.load8(i, cnt, d);
    load8f(local + i, cnt, acc);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = fadd(acc[j], d[j]);  // local += decoded (decode_accumulate)
    if (residual) {
      float r[8];
      load8f(residual + i, cnt, r);
#pragma unroll
      for (int j = 0; j < 8; ++j) y[j] = fadd(acc[j], r[j]);  // encode_add_feedback: x + residual
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) y[j] = acc[j];
    }
  }
  BRAID_DEV void store_acc(std::size_t i, int cnt, const float (&acc)[8]) const {
    if (acc_out) store8f(acc_out + i, cnt, acc);
  }
};

// ---------------------------------------------------------------------------------------
// Block quantisation, one group of 8 elements at a time (the encoder kernel's pass 2).

struct BlockScale {
  int mode;     // 0: non-finite block (scale NaN, codes 0, residual 0); 1: tiny (codes 0,
                // residual = value); 2: quantise
  float scale;  // stored
  float inv;    // levels / absmax (int, fp8)
};

// The scale from the block's |bits| max `m` and (sign1) its eight ordered lane sums.
template <BlockFormat F>
BRAID_DEV BlockScale block_scale(std::uint32_t m, const float (&s)[8], int len) {
  BlockScale b{2, 0.0f, 0.0f};
  if (m >= 0x7f800000u) {
    b.mode = 0;
    b.scale = u2f(kNanBits);
    return b;
  }
  if constexpr (F == BlockFormat::sign1) {
    const float total = add_rn(add_rn(add_rn(s[0], s[4]), add_rn(s[2], s[6])),
                               add_rn(add_rn(s[1], s[5]), add_rn(s[3], s[7])));
    b.scale = div_rn(total, static_cast<float>(len));
    return b;
  } else if constexpr (is_mx(F)) {
    // k = floor(log2 absmax) - emax, clamped to E8M0's -127 (zero and subnormal absmax too).
    const int biased = static_cast<int>(m >> 23);
    int k = biased - 127 - kMxEmax<F>;
    k = biased == 0 || k < -127 ? -127 : k;
    b.scale = pow2(k);
    b.inv = pow2(-k);
    return b;
  } else {
    const float absmax = u2f(m);
    if (absmax < kTinyAbsmax) {
      b.mode = 1;
      return b;
    }
    if constexpr (F == BlockFormat::int8 || F == BlockFormat::int4) {
      b.scale = div_rn(absmax, kLevels<F>);
      b.inv = div_rn(kLevels<F>, absmax);
    } else {
      b.scale = div_rn(absmax, Fp8<F>::kMax);
      b.inv = div_rn(Fp8<F>::kMax, absmax);
    }
    return b;
  }
}

// Codes q (low byte/nibble/bit) and residuals r of y[0..cnt) at payload element e
// (global RNG element p.offset + e); codes of absent elements are 0.
template <BlockFormat F, bool SR>
BRAID_DEV void quantise8(const float (&y)[8], int cnt, const BlockScale& bs, const BlockCodecParams& p,
                         std::uint64_t e, std::uint32_t (&q)[8], float (&r)[8]) {
  if (bs.mode != 2) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      q[j] = 0;
      r[j] = bs.mode == 0 ? 0.0f : y[j];
    }
    return;
  }
  if constexpr (F == BlockFormat::sign1) {
    const std::uint32_t ms = f2u(bs.scale);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const std::uint32_t neg = y[j] < 0.0f ? 1u : 0u;
      q[j] = neg;
      r[j] = fsub(y[j], u2f(ms | (neg << 31)));
    }
  } else if constexpr (F == BlockFormat::int8 || F == BlockFormat::int4) {
    constexpr float L = kLevels<F>;
    float u[8] = {};
    if constexpr (SR) {
      const std::uint64_t g0 = p.offset + e;
      switch (static_cast<int>(g0 & 3)) {
        case 0: uniforms8<0>(p.seed, p.step, g0, u); break;
        case 1: uniforms8<1>(p.seed, p.step, g0, u); break;
        case 2: uniforms8<2>(p.seed, p.step, g0, u); break;
        default: uniforms8<3>(p.seed, p.step, g0, u); break;
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float qf;
      if constexpr (SR) {
        const float v = mul_rn(y[j], bs.inv);
        const float rr = rne(v);
        const float f = rr > v ? sub_rn(rr, 1.0f) : rr;  // floor(v)
        qf = u[j] < sub_rn(v, f) ? add_rn(f, 1.0f) : f;
      } else {
        qf = rne(mul_rn(y[j], bs.inv));
      }
      qf = qf > L ? L : (qf < -L ? -L : qf);
      q[j] = static_cast<std::uint32_t>(static_cast<std::int32_t>(qf));
      r[j] = fsub(y[j], mul_rn(qf, bs.scale));
    }
  } else if constexpr (F == BlockFormat::mxfp8) {
    using E = Fp8<BlockFormat::fp8e4m3>;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      q[j] = E::encode(mul_rn(y[j], bs.inv));
      r[j] = fsub(y[j], fmul(E::decode(q[j]), bs.scale));
    }
  } else if constexpr (F == BlockFormat::mxfp4) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      q[j] = fp4_encode(mul_rn(y[j], bs.inv));
      r[j] = fsub(y[j], fmul(fp4_decode(q[j]), bs.scale));
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      q[j] = Fp8<F>::encode(mul_rn(y[j], bs.inv));
      r[j] = fsub(y[j], fmul(Fp8<F>::decode(q[j]), bs.scale));
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j)
    if (j >= cnt) q[j] = 0;
}

// Packs 8 codes into little-endian payload bytes: sign1 1 byte, int4 4, int8/fp8 8.
template <BlockFormat F>
constexpr int kGroupBytes = F == BlockFormat::sign1 ? 1 : (F == BlockFormat::int4 || F == BlockFormat::mxfp4 ? 4 : 8);
template <BlockFormat F>
BRAID_DEV void pack8(const std::uint32_t (&q)[8], std::uint32_t (&w)[2]) {
  w[0] = w[1] = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if constexpr (F == BlockFormat::sign1)
      w[0] |= q[j] << j;
    else if constexpr (F == BlockFormat::int4 || F == BlockFormat::mxfp4)
      w[0] |= (q[j] & 0xfu) << (4 * j);
    else
      w[j / 4] |= (q[j] & 0xffu) << (8 * (j % 4));
  }
}

// Launchers implemented in codec_block.cu.
Status launch_block_encode(const EncodeArgs& a, Stream s) noexcept;
Status launch_block_fused(const DecodeReduceEncodeArgs& a, Stream s) noexcept;

}  // namespace braid::kernels::cuda::detail
