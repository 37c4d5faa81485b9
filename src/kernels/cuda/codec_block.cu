// braid CUDA block-format encoders (int8, int4, fp8e4m3, fp8e5m2, sign1), plain and fused
// with a decode + reduce in front (the compressed ring step).
//
// One warp per scale block (8 warps per thread block, grid-stride over scale blocks), so
// the absmax is a warp reduction (__reduce_max_sync) and there are no atomics. Each lane
// owns 8 consecutive elements of each 256-element chunk of the scale block (two 16-byte
// loads where aligned). Pass 1 finds the |bits| max (and, for sign1, the eight ordered
// lane sums of docs/codecs.md through a per-warp shared-memory staging of the chunk);
// pass 2 re-reads the block (L1/L2 hits) and writes codes, scale and residual. The
// per-element arithmetic is the host's, in the host's order. One launch encodes every
// frame of a framed payload (compression/framed.hpp): a frame is a multiple of the block,
// so each scale block lies in one frame, whose scales and codes it addresses.
#include "kernels/cuda/codec_device.cuh"

namespace braid::kernels::cuda::detail {
BRAID_KERNEL_MODULE()
namespace {

constexpr int kWarps = 8;
constexpr int kChunk = 256;  // elements per warp iteration: 32 lanes x 8

// Payloads laid end to end, one per `frame` values (the last may be shorter).
struct Frames {
  std::size_t frame;        // values per frame (a multiple of the block); at least n: one
  std::size_t frame_bytes;  // payload bytes of a whole frame
  std::size_t last_bytes;   // payload bytes of the last frame
};

template <BlockFormat F, bool SR, bool FB, class Src>
__global__ void __launch_bounds__(kWarps * 32)
    block_encode_kernel(BlockCodecParams p, Src src, std::size_t n, std::size_t nb, std::uint8_t* out,
                        float* residual, Frames fr) {
  __shared__ float stage[F == BlockFormat::sign1 ? kWarps : 1][F == BlockFormat::sign1 ? kChunk : 1];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const std::uint32_t B = p.block;
  for (std::size_t b = static_cast<std::size_t>(blockIdx.x) * kWarps + warp; b < nb;
       b += static_cast<std::size_t>(gridDim.x) * kWarps) {
    const std::size_t start = b * B;
    const int len = static_cast<int>(n - start < B ? n - start : B);
    // This block's frame: its values, scale blocks and payload.
    const std::size_t f = start / fr.frame, fstart = f * fr.frame;
    const std::size_t fm = n - fstart < fr.frame ? n - fstart : fr.frame;
    const std::size_t fnb = (fm + B - 1) / B, lb = b - fstart / B;
    std::uint8_t* fout = out + f * fr.frame_bytes;
    std::uint8_t* codes = fout + scale_bytes(F) * fnb;
    // Pass 1.
    std::uint32_t m = 0;
    float lane_sum = 0.0f;
    for (int c = 0; c < len; c += kChunk) {
      const int i0 = c + 8 * lane;
      const int cnt = len - i0;
      float y[8], acc[8];
      if (cnt > 0) {
        src.load8(start + i0, cnt, y, acc);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) y[j] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const std::uint32_t a = f2u(y[j]) & 0x7fffffffu;
        m = a > m ? a : m;
      }
      if constexpr (F == BlockFormat::sign1) {
#pragma unroll
        for (int j = 0; j < 8; ++j) stage[warp][8 * lane + j] = u2f(f2u(y[j]) & 0x7fffffffu);
        __syncwarp();
        if (lane < 8)
          for (int t = 0; t < kChunk / 8 && c + 8 * t + lane < len; ++t)
            lane_sum = fadd(lane_sum, stage[warp][8 * t + lane]);
        __syncwarp();
      }
    }
    m = __reduce_max_sync(0xffffffffu, m);
    float sums[8] = {};
    if constexpr (F == BlockFormat::sign1) {
#pragma unroll
      for (int k = 0; k < 8; ++k) sums[k] = __shfl_sync(0xffffffffu, lane_sum, k);
    }
    const BlockScale bs = block_scale<F>(m, sums, len);
    if (lane == 0) {
      if constexpr (is_mx(F)) {  // E8M0: k + 127 (2^-127 is the subnormal 0x00400000), 0xff NaN
        const std::uint32_t sb = f2u(bs.scale);
        fout[lb] = static_cast<std::uint8_t>(bs.mode == 0 ? 0xffu : (sb == 0x00400000u ? 0u : sb >> 23));
      } else {
        store_u32(fout + 4 * lb, f2u(bs.scale));
      }
    }
    // Pass 2.
    for (int c = 0; c < len; c += kChunk) {
      const int i0 = c + 8 * lane;
      const int cnt = len - i0;
      if (cnt <= 0) continue;
      const std::size_t e = start + i0, ce = e - fstart;  // value index; its code's in the frame
      float y[8], acc[8], r[8];
      src.load8(e, cnt, y, acc);
      if constexpr (Src::kFused) src.store_acc(e, cnt, acc);
      std::uint32_t q[8], w[2];
      quantise8<F, SR>(y, cnt, bs, p, e, q, r);
      pack8<F>(q, w);
      if constexpr (F == BlockFormat::sign1) {
        codes[ce / 8] = static_cast<std::uint8_t>(w[0]);
      } else if constexpr (F == BlockFormat::int4 || F == BlockFormat::mxfp4) {
        const std::uint32_t w1[1] = {w[0]};
        if (cnt >= 8)
          store_bytes<4>(codes + ce / 2, w1);
        else
          store_partial(codes + ce / 2, w1, (cnt + 1) / 2);
      } else {
        if (cnt >= 8)
          store_bytes<8>(codes + ce, w);
        else
          store_partial(codes + ce, w, cnt);
      }
      if constexpr (FB) store8f(residual + e, cnt, r);
    }
    if (lb == fnb - 1 && lane == 0) {
      const std::size_t end = fstart + fr.frame >= n ? fr.last_bytes : fr.frame_bytes;
      for (std::size_t k = scale_bytes(F) * fnb + codes_bytes(F, fm); k < end; ++k) fout[k] = 0;
    }
  }
}

// Dispatch on (format, stochastic, feedback) for a source built by make(format tag).
// frame: values per frame of a framed payload (a multiple of the block); 0: one payload.
template <BlockFormat F, class Src>
Status by_flags(const BlockCodecParams& p, const Src& src, std::size_t n, std::uint8_t* out, float* residual,
                Stream s, std::size_t frame = 0) {
  const std::size_t nb = (n + p.block - 1) / p.block;
  const unsigned grid = grid_for(nb, kWarps, 16 * 32 / kWarps);
  Frames fr{n, block_payload_bytes(F, p.block, n), 0};
  if (frame != 0 && frame < n) fr = Frames{frame, block_payload_bytes(F, p.block, frame), 0};
  fr.last_bytes = block_payload_bytes(F, p.block, n - (n - 1) / fr.frame * fr.frame);
  constexpr bool kInt = F == BlockFormat::int8 || F == BlockFormat::int4;
  if (kInt && p.stochastic) {
    if (residual)
      block_encode_kernel<F, kInt, true, Src><<<grid, kWarps * 32, 0, s>>>(p, src, n, nb, out, residual, fr);
    else
      block_encode_kernel<F, kInt, false, Src><<<grid, kWarps * 32, 0, s>>>(p, src, n, nb, out, residual, fr);
  } else {
    if (residual)
      block_encode_kernel<F, false, true, Src><<<grid, kWarps * 32, 0, s>>>(p, src, n, nb, out, residual, fr);
    else
      block_encode_kernel<F, false, false, Src><<<grid, kWarps * 32, 0, s>>>(p, src, n, nb, out, residual, fr);
  }
  return last_status();
}

}  // namespace

Status launch_block_encode(const EncodeArgs& a, Stream s) noexcept {
  const PlainSrc src{a.in, a.add};
  const BlockCodecParams& p = a.codec.block;
  return by_format(p.format, [&](auto tag) {
    return by_flags<decltype(tag)::value>(p, src, a.n, a.out, a.residual, s, a.frame);
  });
}

Status launch_block_fused(const DecodeReduceEncodeArgs& a, Stream s) noexcept {
  const BlockCodecParams& p = a.codec.block;
  const std::size_t nb = (a.n + p.block - 1) / p.block;
  auto run = [&](auto tag) {
    constexpr BlockFormat F = decltype(tag)::value;
    const FusedSrc<BlockDec<F>> src{BlockDec<F>{a.in_payload, nb, p.block}, a.local, a.residual, a.acc_out};
    return by_flags<F>(p, src, a.n, a.out_payload, a.residual, s);
  };
  return by_format(p.format, run);
}

}  // namespace braid::kernels::cuda::detail
