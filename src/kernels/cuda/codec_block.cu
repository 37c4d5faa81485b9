// braid CUDA block-format encoders (int8, int4, fp8e4m3, fp8e5m2, sign1), plain and fused
// with a decode + reduce in front (the compressed ring step).
//
// One warp per scale block (8 warps per thread block, grid-stride over scale blocks), so
// the absmax is a warp reduction (__reduce_max_sync) and there are no atomics. Each lane
// owns 8 consecutive elements of each 256-element chunk of the scale block (two 16-byte
// loads where aligned). Pass 1 finds the |bits| max (and, for sign1, the eight ordered
// lane sums of docs/codecs.md through a per-warp shared-memory staging of the chunk);
// pass 2 re-reads the block (L1/L2 hits) and writes codes, scale and residual. The
// per-element arithmetic is the host's, in the host's order.
#include "kernels/cuda/codec_device.cuh"

namespace braid::kernels::cuda::detail {
namespace {

constexpr int kWarps = 8;
constexpr int kChunk = 256;  // elements per warp iteration: 32 lanes x 8

template <BlockFormat F, bool SR, bool FB, class Src>
__global__ void __launch_bounds__(kWarps * 32)
    block_encode_kernel(BlockCodecParams p, Src src, std::size_t n, std::size_t nb, std::uint8_t* out,
                        float* residual, std::size_t payload_bytes) {
  __shared__ float stage[F == BlockFormat::sign1 ? kWarps : 1][F == BlockFormat::sign1 ? kChunk : 1];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const std::uint32_t B = p.block;
  std::uint8_t* codes = out + 4 * nb;
  for (std::size_t b = static_cast<std::size_t>(blockIdx.x) * kWarps + warp; b < nb;
       b += static_cast<std::size_t>(gridDim.x) * kWarps) {
    const std::size_t start = b * B;
    const int len = static_cast<int>(n - start < B ? n - start : B);
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
    if (lane == 0) store_u32(out + 4 * b, f2u(bs.scale));
    // Pass 2.
    for (int c = 0; c < len; c += kChunk) {
      const int i0 = c + 8 * lane;
      const int cnt = len - i0;
      if (cnt <= 0) continue;
      const std::size_t e = start + i0;
      float y[8], acc[8], r[8];
      src.load8(e, cnt, y, acc);
      if constexpr (Src::kFused) src.store_acc(e, cnt, acc);
      std::uint32_t q[8], w[2];
      quantise8<F, SR>(y, cnt, bs, p, e, q, r);
      pack8<F>(q, w);
      if constexpr (F == BlockFormat::sign1) {
        codes[e / 8] = static_cast<std::uint8_t>(w[0]);
      } else if constexpr (F == BlockFormat::int4) {
        const std::uint32_t w1[1] = {w[0]};
        if (cnt >= 8)
          store_bytes<4>(codes + e / 2, w1);
        else
          store_partial(codes + e / 2, w1, (cnt + 1) / 2);
      } else {
        if (cnt >= 8)
          store_bytes<8>(codes + e, w);
        else
          store_partial(codes + e, w, cnt);
      }
      if constexpr (FB) store8f(residual + e, cnt, r);
    }
    if (b == nb - 1 && lane == 0)
      for (std::size_t k = 4 * nb + codes_bytes(F, n); k < payload_bytes; ++k) out[k] = 0;
  }
}

// Dispatch on (format, stochastic, feedback) for a source built by make(format tag).
template <BlockFormat F, class Src>
Status by_flags(const BlockCodecParams& p, const Src& src, std::size_t n, std::uint8_t* out, float* residual,
                Stream s) {
  const std::size_t nb = (n + p.block - 1) / p.block;
  const unsigned grid = grid_for(nb, kWarps, 16 * 32 / kWarps);
  const std::size_t pb = block_payload_bytes(F, p.block, n);
  constexpr bool kInt = F == BlockFormat::int8 || F == BlockFormat::int4;
  if (kInt && p.stochastic) {
    if (residual)
      block_encode_kernel<F, kInt, true, Src><<<grid, kWarps * 32, 0, s>>>(p, src, n, nb, out, residual, pb);
    else
      block_encode_kernel<F, kInt, false, Src><<<grid, kWarps * 32, 0, s>>>(p, src, n, nb, out, residual, pb);
  } else {
    if (residual)
      block_encode_kernel<F, false, true, Src><<<grid, kWarps * 32, 0, s>>>(p, src, n, nb, out, residual, pb);
    else
      block_encode_kernel<F, false, false, Src><<<grid, kWarps * 32, 0, s>>>(p, src, n, nb, out, residual, pb);
  }
  return last_status();
}

}  // namespace

Status launch_block_encode(const EncodeArgs& a, Stream s) noexcept {
  const PlainSrc src{a.in, a.add};
  const BlockCodecParams& p = a.codec.block;
  switch (p.format) {
    case BlockFormat::int8: return by_flags<BlockFormat::int8>(p, src, a.n, a.out, a.residual, s);
    case BlockFormat::int4: return by_flags<BlockFormat::int4>(p, src, a.n, a.out, a.residual, s);
    case BlockFormat::fp8e4m3: return by_flags<BlockFormat::fp8e4m3>(p, src, a.n, a.out, a.residual, s);
    case BlockFormat::fp8e5m2: return by_flags<BlockFormat::fp8e5m2>(p, src, a.n, a.out, a.residual, s);
    case BlockFormat::sign1: return by_flags<BlockFormat::sign1>(p, src, a.n, a.out, a.residual, s);
  }
  return kInvalidValue;
}

Status launch_block_fused(const DecodeReduceEncodeArgs& a, Stream s) noexcept {
  const BlockCodecParams& p = a.codec.block;
  const std::size_t nb = (a.n + p.block - 1) / p.block;
  auto run = [&](auto tag) {
    constexpr BlockFormat F = decltype(tag)::value;
    const FusedSrc<BlockDec<F>> src{BlockDec<F>{a.in_payload, nb, p.block}, a.local, a.residual, a.acc_out};
    return by_flags<F>(p, src, a.n, a.out_payload, a.residual, s);
  };
  switch (p.format) {
    case BlockFormat::int8: return run(std::integral_constant<BlockFormat, BlockFormat::int8>{});
    case BlockFormat::int4: return run(std::integral_constant<BlockFormat, BlockFormat::int4>{});
    case BlockFormat::fp8e4m3: return run(std::integral_constant<BlockFormat, BlockFormat::fp8e4m3>{});
    case BlockFormat::fp8e5m2: return run(std::integral_constant<BlockFormat, BlockFormat::fp8e5m2>{});
    case BlockFormat::sign1: return run(std::integral_constant<BlockFormat, BlockFormat::sign1>{});
  }
  return kInvalidValue;
}

}  // namespace braid::kernels::cuda::detail
