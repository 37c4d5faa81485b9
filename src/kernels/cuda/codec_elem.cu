// braid CUDA element-wise codecs (none = raw f32, fp16, bf16), every decoder, and the
// public dispatch (encode, decode, decode_reduce_encode, payload_bytes).
//
// One thread per group of 8 consecutive elements, grid-stride; 16-byte loads and stores
// where the pointers allow, byte-exact tails. Block formats are decoded the same way:
// B is a multiple of 8, so a group never straddles two scale blocks.
#include "kernels/cuda/codec_device.cuh"

namespace braid::kernels::cuda {
BRAID_KERNEL_MODULE()
namespace detail {
namespace {

template <class Fmt, bool FB, class Src>
__global__ void __launch_bounds__(256)
    elem_encode_kernel(Src src, std::size_t n, std::uint8_t* out, float* residual) {
  constexpr int K = Fmt::kBytes;
  const std::size_t groups = (n + 7) / 8;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t g = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
    const std::size_t i = 8 * g;
    const int cnt = n - i < 8 ? static_cast<int>(n - i) : 8;
    float y[8], acc[8], r[8];
    src.load8(i, cnt, y, acc);
    if constexpr (Src::kFused) src.store_acc(i, cnt, acc);
    std::uint32_t w[2 * K] = {};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const std::uint32_t c = Fmt::enc(y[j]);
      if constexpr (K == 4)
        w[j] = c;
      else
        w[j / 2] |= (c & 0xffffu) << (16 * (j % 2));
      // none: the residual is 0 (the value travels exactly), as the host writes it.
      r[j] = K == 4 ? 0.0f : fsub(y[j], Fmt::dec(c));
    }
    if (cnt >= 8) {
      store_bytes<8 * K>(out + K * i, w);
    } else {
      store_partial(out + K * i, w, K * cnt);
      // Zero padding to a multiple of 4 (fp16/bf16 with an odd count).
      if (K == 2 && (cnt & 1)) out[K * n] = out[K * n + 1] = 0;
    }
    if constexpr (FB) store8f(residual + i, cnt, r);
  }
}

template <class Dec, bool ACC>
__global__ void __launch_bounds__(256) decode_kernel(Dec dec, std::size_t n, float* out) {
  const std::size_t groups = (n + 7) / 8;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t g = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
    const std::size_t i = 8 * g;
    const int cnt = n - i < 8 ? static_cast<int>(n - i) : 8;
    float v[8];
    dec.load8(i, cnt, v);
    if constexpr (ACC) {
      float o[8];
      load8f(out + i, cnt, o);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = fadd(o[j], v[j]);
    }
    store8f(out + i, cnt, v);
  }
}

template <class Fmt, class Src>
Status launch_elem_encode(const Src& src, std::size_t n, std::uint8_t* out, float* residual, Stream s) {
  const unsigned grid = grid_for((n + 7) / 8, 256);
  if (residual)
    elem_encode_kernel<Fmt, true, Src><<<grid, 256, 0, s>>>(src, n, out, residual);
  else
    elem_encode_kernel<Fmt, false, Src><<<grid, 256, 0, s>>>(src, n, out, residual);
  return last_status();
}

template <class Dec>
Status launch_decode(const Dec& dec, std::size_t n, float* out, bool acc, Stream s) {
  const unsigned grid = grid_for((n + 7) / 8, 256);
  if (acc)
    decode_kernel<Dec, true><<<grid, 256, 0, s>>>(dec, n, out);
  else
    decode_kernel<Dec, false><<<grid, 256, 0, s>>>(dec, n, out);
  return last_status();
}

// A block format's frames hold whole scale blocks.
bool valid_frame(const DeviceCodec& c, std::size_t frame) {
  return c.kind != DeviceCodec::Kind::block || frame % c.block.block == 0;
}

bool valid_codec(const DeviceCodec& c) {
  switch (c.kind) {
    case DeviceCodec::Kind::raw:
    case DeviceCodec::Kind::fp16:
    case DeviceCodec::Kind::bf16: return true;
    case DeviceCodec::Kind::block:
      return static_cast<unsigned>(c.block.format) <= static_cast<unsigned>(BlockFormat::mxfp4) &&
             c.block.block >= 8 && c.block.block <= kMaxCodecBlock && c.block.block % 8 == 0;
  }
  return false;
}

}  // namespace
}  // namespace detail

using namespace detail;

std::size_t payload_bytes(const DeviceCodec& codec, std::size_t n) noexcept {
  switch (codec.kind) {
    case DeviceCodec::Kind::raw: return 4 * n;
    case DeviceCodec::Kind::fp16:
    case DeviceCodec::Kind::bf16: return half_payload_bytes(n);
    case DeviceCodec::Kind::block: return block_payload_bytes(codec.block.format, codec.block.block, n);
  }
  return 0;
}

Status encode(const EncodeArgs& a, Stream s) noexcept {
  if (!valid_codec(a.codec) || !valid_frame(a.codec, a.frame)) return kInvalidValue;
  if (a.n == 0) return 0;
  if (!a.in || !a.out) return kInvalidValue;
  const PlainSrc src{a.in, a.add};
  switch (a.codec.kind) {
    case DeviceCodec::Kind::raw: return launch_elem_encode<RawFmt>(src, a.n, a.out, a.residual, s);
    case DeviceCodec::Kind::fp16: return launch_elem_encode<Fp16Fmt>(src, a.n, a.out, a.residual, s);
    case DeviceCodec::Kind::bf16: return launch_elem_encode<Bf16Fmt>(src, a.n, a.out, a.residual, s);
    case DeviceCodec::Kind::block: return launch_block_encode(a, s);
  }
  return kInvalidValue;
}

Status decode(const DecodeArgs& a, Stream s) noexcept {
  if (!valid_codec(a.codec) || !valid_frame(a.codec, a.frame)) return kInvalidValue;
  if (a.n == 0) return 0;
  if (!a.in || !a.out) return kInvalidValue;
  switch (a.codec.kind) {
    case DeviceCodec::Kind::raw: return launch_decode(ElemDec<RawFmt>{a.in}, a.n, a.out, a.accumulate, s);
    case DeviceCodec::Kind::fp16: return launch_decode(ElemDec<Fp16Fmt>{a.in}, a.n, a.out, a.accumulate, s);
    case DeviceCodec::Kind::bf16: return launch_decode(ElemDec<Bf16Fmt>{a.in}, a.n, a.out, a.accumulate, s);
    case DeviceCodec::Kind::block: break;
  }
  const std::uint32_t B = a.codec.block.block;
  auto run = [&](auto tag) {
    constexpr BlockFormat F = decltype(tag)::value;
    return launch_decode(block_dec<F>(a.in, a.n, B, a.frame), a.n, a.out, a.accumulate, s);
  };
  return by_format(a.codec.block.format, run);
}

Status decode_reduce_encode(const DecodeReduceEncodeArgs& a, Stream s) noexcept {
  if (!valid_codec(a.codec)) return kInvalidValue;
  if (a.n == 0) return 0;
  if (!a.in_payload || !a.local || !a.out_payload) return kInvalidValue;
  switch (a.codec.kind) {
    case DeviceCodec::Kind::raw:
      return launch_elem_encode<RawFmt>(FusedSrc<ElemDec<RawFmt>>{{a.in_payload}, a.local, a.residual, a.acc_out},
                                        a.n, a.out_payload, a.residual, s);
    case DeviceCodec::Kind::fp16:
      return launch_elem_encode<Fp16Fmt>(
          FusedSrc<ElemDec<Fp16Fmt>>{{a.in_payload}, a.local, a.residual, a.acc_out}, a.n, a.out_payload,
          a.residual, s);
    case DeviceCodec::Kind::bf16:
      return launch_elem_encode<Bf16Fmt>(
          FusedSrc<ElemDec<Bf16Fmt>>{{a.in_payload}, a.local, a.residual, a.acc_out}, a.n, a.out_payload,
          a.residual, s);
    case DeviceCodec::Kind::block: return launch_block_fused(a, s);
  }
  return kInvalidValue;
}

}  // namespace braid::kernels::cuda
