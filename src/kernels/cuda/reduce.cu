// braid CUDA reduction kernels: dst = a (op) b for every dtype x op, divide() for avg and
// scale() for premul_sum.
// Same arithmetic as src/kernels/host/reduce.cpp: integers wrap (unsigned arithmetic),
// f16/bf16/fp8 are widened to f32, combined and rounded back to nearest even with the
// host's bit recipes (fp8: codec_device.cuh Fp8, satfinite, NaN -> 0x7f), floating min/max return isnan(a) ? a : (a < b ? a : b) (resp. >).
//
// Layout: one grid-stride kernel per (type, op). Work items are a scalar head (elements
// before dst reaches 16-byte alignment), 16-byte vectors, and a scalar tail; when a or b
// is misaligned relative to dst everything is scalar (correct, slower).
#include "kernels/cuda/codec_device.cuh"
#include "kernels/cuda/device_common.cuh"

namespace braid::kernels::cuda {
BRAID_KERNEL_MODULE()
namespace {
using namespace detail;

template <class T>
struct Wrap {
  using type = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
};

enum class Op { sum, prod, min, max };

template <Op O, class T>
BRAID_DEV T apply_native(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using W = typename Wrap<T>::type;
    if constexpr (O == Op::sum) return static_cast<T>(static_cast<W>(static_cast<W>(a) + static_cast<W>(b)));
    if constexpr (O == Op::prod) return static_cast<T>(static_cast<W>(static_cast<W>(a) * static_cast<W>(b)));
    if constexpr (O == Op::min) return b < a ? b : a;
    if constexpr (O == Op::max) return a < b ? b : a;
  } else {
    if constexpr (O == Op::sum) return fadd(a, b);  // x86 NaN rules, never contracted
    if constexpr (O == Op::prod) return fmul(a, b);
    if constexpr (O == Op::min) return a != a ? a : (a < b ? a : b);
    if constexpr (O == Op::max) return a != a ? a : (a > b ? a : b);
  }
}

// Storage type S, and how one element is combined.
template <class T, Op O>
struct NativeE {
  using S = T;
  static BRAID_DEV S apply(S a, S b) { return apply_native<O>(a, b); }
};
template <Op O>
struct HalfE {
  using S = std::uint16_t;
  static BRAID_DEV S apply(S a, S b) { return static_cast<S>(f2h(apply_native<O>(h2f(a), h2f(b)))); }
};
template <Op O>
struct Bf16E {
  using S = std::uint16_t;
  static BRAID_DEV S apply(S a, S b) { return static_cast<S>(f2bf(apply_native<O>(bf2f(a), bf2f(b)))); }
};

template <BlockFormat F>
struct Fp8Of {
  template <Op O>
  struct E {
    using S = std::uint8_t;
    static BRAID_DEV S apply(S a, S b) {
      return static_cast<S>(Fp8<F>::narrow(apply_native<O>(Fp8<F>::decode(a), Fp8<F>::decode(b))));
    }
  };
};

template <class E>
__global__ void __launch_bounds__(256) reduce_kernel(typename E::S* d, const typename E::S* a,
                                                     const typename E::S* b, std::size_t n, std::size_t head,
                                                     std::size_t nvec) {
  using S = typename E::S;
  constexpr int V = 16 / sizeof(S);
  const std::size_t tail_start = head + nvec * V;
  const std::size_t items = head + nvec + (n - tail_start);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < items; t += stride) {
    if (t >= head && t < head + nvec) {
      const std::size_t e = head + (t - head) * V;
      union U {
        uint4 v;
        S s[V];
      } x, y;
      x.v = *reinterpret_cast<const uint4*>(a + e);
      y.v = *reinterpret_cast<const uint4*>(b + e);
#pragma unroll
      for (int j = 0; j < V; ++j) x.s[j] = E::apply(x.s[j], y.s[j]);
      *reinterpret_cast<uint4*>(d + e) = x.v;
    } else {
      const std::size_t e = t < head ? t : tail_start + (t - head - nvec);
      d[e] = E::apply(a[e], b[e]);
    }
  }
}

template <class E>
Status launch_reduce(const ReduceArgs& r, Stream s) {
  using S = typename E::S;
  constexpr std::size_t V = 16 / sizeof(S);
  auto* d = static_cast<S*>(r.dst);
  const auto* a = static_cast<const S*>(r.a);
  const auto* b = static_cast<const S*>(r.b);
  const auto ud = reinterpret_cast<std::uintptr_t>(d);
  std::size_t head = r.n, nvec = 0;
  if (((ud ^ reinterpret_cast<std::uintptr_t>(a)) & 15) == 0 && ((ud ^ reinterpret_cast<std::uintptr_t>(b)) & 15) == 0) {
    head = ((16 - (ud & 15)) & 15) / sizeof(S);
    if (head > r.n) head = r.n;
    nvec = (r.n - head) / V;
  }
  const std::size_t items = head + nvec + (r.n - head - nvec * V);
  reduce_kernel<E><<<grid_for(items, 256), 256, 0, s>>>(d, a, b, r.n, head, nvec);
  return last_status();
}

template <template <Op> class E>
Status by_op(const ReduceArgs& r, Stream s) {
  switch (r.op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
    case ReduceOp::premul_sum: return launch_reduce<E<Op::sum>>(r, s);
    case ReduceOp::prod: return launch_reduce<E<Op::prod>>(r, s);
    case ReduceOp::min: return launch_reduce<E<Op::min>>(r, s);
    case ReduceOp::max: return launch_reduce<E<Op::max>>(r, s);
  }
  return kInvalidValue;
}
template <class T>
struct NativeOf {
  template <Op O>
  using E = NativeE<T, O>;
};

// --------------------------------------------------------------------------------------
// divide (not hot: once per avg on the final result), scalar grid-stride.

template <class T>
__global__ void divide_float(T* p, std::size_t n, T q) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = fdiv(p[i], q);
}
template <bool Half>
__global__ void divide_16(std::uint16_t* p, std::size_t n, float q) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = static_cast<std::uint16_t>(Half ? f2h(fdiv(h2f(p[i]), q)) : f2bf(fdiv(bf2f(p[i]), q)));
}
template <BlockFormat F>
__global__ void divide_fp8(std::uint8_t* p, std::size_t n, float q) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = static_cast<std::uint8_t>(Fp8<F>::narrow(fdiv(Fp8<F>::decode(p[i]), q)));
}
template <class T>
__global__ void divide_int(T* p, std::size_t n, int divisor) {
  using U = typename Wrap<T>::type;
  using W = std::conditional_t<(sizeof(T) < sizeof(std::int64_t)), std::int32_t, std::int64_t>;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (divisor == -1)
      p[i] = static_cast<T>(static_cast<U>(U{0} - static_cast<U>(p[i])));
    else
      p[i] = static_cast<T>(static_cast<W>(p[i]) / static_cast<W>(divisor));
  }
}

// scale (premul_sum's input, once per call), scalar grid-stride; kernels::scale's arithmetic.
template <class T>
__global__ void scale_float(T* d, const T* x, std::size_t n, T k) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    d[i] = fmul(x[i], k);
}
template <bool Half>
__global__ void scale_16(std::uint16_t* d, const std::uint16_t* x, std::size_t n, float k) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    d[i] = static_cast<std::uint16_t>(Half ? f2h(fmul(h2f(x[i]), k)) : f2bf(fmul(bf2f(x[i]), k)));
}
template <BlockFormat F>
__global__ void scale_fp8(std::uint8_t* d, const std::uint8_t* x, std::size_t n, float k) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    d[i] = static_cast<std::uint8_t>(Fp8<F>::narrow(fmul(Fp8<F>::decode(x[i]), k)));
}
template <class T>
__global__ void scale_int(T* d, const T* x, std::size_t n, std::int64_t k) {
  using U = typename Wrap<T>::type;
  const auto w = static_cast<U>(static_cast<std::uint64_t>(k));
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    d[i] = static_cast<T>(static_cast<U>(static_cast<U>(x[i]) * w));
}
// reduce_scaled: a + scale(b), the product rounded first (kernels::reduce_scaled).
template <class T>
__global__ void reduce_scaled_float(T* d, const T* a, const T* b, std::size_t n, T k) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    d[i] = fadd(a[i], fmul(b[i], k));
}
template <bool Half>
__global__ void reduce_scaled_16(std::uint16_t* d, const std::uint16_t* a, const std::uint16_t* b, std::size_t n,
                                 float k) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (Half) d[i] = static_cast<std::uint16_t>(f2h(fadd(h2f(a[i]), h2f(f2h(fmul(h2f(b[i]), k))))));
    else d[i] = static_cast<std::uint16_t>(f2bf(fadd(bf2f(a[i]), bf2f(f2bf(fmul(bf2f(b[i]), k))))));
  }
}
template <BlockFormat F>
__global__ void reduce_scaled_fp8(std::uint8_t* d, const std::uint8_t* a, const std::uint8_t* b, std::size_t n,
                                  float k) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    d[i] = static_cast<std::uint8_t>(
        Fp8<F>::narrow(fadd(Fp8<F>::decode(a[i]), Fp8<F>::decode(Fp8<F>::narrow(fmul(Fp8<F>::decode(b[i]), k))))));
}
template <class T>
__global__ void reduce_scaled_int(T* d, const T* a, const T* b, std::size_t n, std::int64_t k) {
  using U = typename Wrap<T>::type;
  const auto w = static_cast<U>(static_cast<std::uint64_t>(k));
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    d[i] = static_cast<T>(static_cast<U>(static_cast<U>(a[i]) + static_cast<U>(static_cast<U>(b[i]) * w)));
}

// An integral factor as the integer kernels take it (the caller checked it; an
// out-of-range one still must not be UB here).
std::int64_t integral_factor(double f) { return f >= -9.2e18 && f <= 9.2e18 ? static_cast<std::int64_t>(f) : 0; }

template <class T, class K>
Status launch_reduce_scaled(const ReduceScaledArgs& r, Stream s, K k) {
  const unsigned grid = grid_for(r.n, 256);
  auto* d = static_cast<T*>(r.dst);
  const auto* a = static_cast<const T*>(r.a);
  const auto* b = static_cast<const T*>(r.b);
  if constexpr (std::is_integral_v<T>)
    reduce_scaled_int<T><<<grid, 256, 0, s>>>(d, a, b, r.n, k);
  else
    reduce_scaled_float<T><<<grid, 256, 0, s>>>(d, a, b, r.n, k);
  return last_status();
}

template <class T, class K>
Status launch_scale(const ScaleArgs& r, Stream s, K k) {
  const unsigned grid = grid_for(r.n, 256);
  if constexpr (std::is_integral_v<T>)
    scale_int<T><<<grid, 256, 0, s>>>(static_cast<T*>(r.dst), static_cast<const T*>(r.src), r.n, k);
  else
    scale_float<T><<<grid, 256, 0, s>>>(static_cast<T*>(r.dst), static_cast<const T*>(r.src), r.n, k);
  return last_status();
}

}  // namespace

Status reduce(const ReduceArgs& r, Stream s) noexcept {
  if (static_cast<int>(r.dtype) >= kNumDataTypes || static_cast<int>(r.op) >= kNumReduceOps) return kInvalidValue;
  if (r.n == 0) return 0;
  if (!r.dst || !r.a || !r.b) return kInvalidValue;
  switch (r.dtype) {
    case DataType::f32: return by_op<NativeOf<float>::E>(r, s);
    case DataType::f64: return by_op<NativeOf<double>::E>(r, s);
    case DataType::f16: return by_op<HalfE>(r, s);
    case DataType::bf16: return by_op<Bf16E>(r, s);
    case DataType::i8: return by_op<NativeOf<std::int8_t>::E>(r, s);
    case DataType::u8: return by_op<NativeOf<std::uint8_t>::E>(r, s);
    case DataType::i32: return by_op<NativeOf<std::int32_t>::E>(r, s);
    case DataType::i64: return by_op<NativeOf<std::int64_t>::E>(r, s);
    case DataType::f8e4m3: return by_op<Fp8Of<BlockFormat::fp8e4m3>::E>(r, s);
    case DataType::f8e5m2: return by_op<Fp8Of<BlockFormat::fp8e5m2>::E>(r, s);
  }
  return kInvalidValue;
}

Status divide(const DivideArgs& r, Stream s) noexcept {
  if (static_cast<int>(r.dtype) >= kNumDataTypes) return kInvalidValue;
  if (r.n == 0) return 0;
  if (!r.buf) return kInvalidValue;
  const bool is_int = r.dtype == DataType::i8 || r.dtype == DataType::u8 || r.dtype == DataType::i32 ||
                      r.dtype == DataType::i64;
  if (is_int && (r.divisor == 0 || r.divisor == 1)) return 0;
  const unsigned grid = grid_for(r.n, 256);
  switch (r.dtype) {
    case DataType::f32: divide_float<float><<<grid, 256, 0, s>>>(static_cast<float*>(r.buf), r.n, static_cast<float>(r.divisor)); break;
    case DataType::f64: divide_float<double><<<grid, 256, 0, s>>>(static_cast<double*>(r.buf), r.n, static_cast<double>(r.divisor)); break;
    case DataType::f16: divide_16<true><<<grid, 256, 0, s>>>(static_cast<std::uint16_t*>(r.buf), r.n, static_cast<float>(r.divisor)); break;
    case DataType::bf16: divide_16<false><<<grid, 256, 0, s>>>(static_cast<std::uint16_t*>(r.buf), r.n, static_cast<float>(r.divisor)); break;
    case DataType::i8: divide_int<std::int8_t><<<grid, 256, 0, s>>>(static_cast<std::int8_t*>(r.buf), r.n, r.divisor); break;
    case DataType::u8: divide_int<std::uint8_t><<<grid, 256, 0, s>>>(static_cast<std::uint8_t*>(r.buf), r.n, r.divisor); break;
    case DataType::i32: divide_int<std::int32_t><<<grid, 256, 0, s>>>(static_cast<std::int32_t*>(r.buf), r.n, r.divisor); break;
    case DataType::i64: divide_int<std::int64_t><<<grid, 256, 0, s>>>(static_cast<std::int64_t*>(r.buf), r.n, r.divisor); break;
    case DataType::f8e4m3: divide_fp8<BlockFormat::fp8e4m3><<<grid, 256, 0, s>>>(static_cast<std::uint8_t*>(r.buf), r.n, static_cast<float>(r.divisor)); break;
    case DataType::f8e5m2: divide_fp8<BlockFormat::fp8e5m2><<<grid, 256, 0, s>>>(static_cast<std::uint8_t*>(r.buf), r.n, static_cast<float>(r.divisor)); break;
  }
  return last_status();
}

Status scale(const ScaleArgs& r, Stream s) noexcept {
  if (static_cast<int>(r.dtype) >= kNumDataTypes) return kInvalidValue;
  if (r.n == 0) return 0;
  if (!r.dst || !r.src) return kInvalidValue;
  const std::int64_t k = integral_factor(r.factor);
  const float kf = static_cast<float>(r.factor);
  switch (r.dtype) {
    case DataType::f32: return launch_scale<float>(r, s, kf);
    case DataType::f64: return launch_scale<double>(r, s, r.factor);
    case DataType::f16:
    case DataType::bf16: {
      auto* d = static_cast<std::uint16_t*>(r.dst);
      const auto* x = static_cast<const std::uint16_t*>(r.src);
      if (r.dtype == DataType::f16) scale_16<true><<<grid_for(r.n, 256), 256, 0, s>>>(d, x, r.n, kf);
      else scale_16<false><<<grid_for(r.n, 256), 256, 0, s>>>(d, x, r.n, kf);
      return last_status();
    }
    case DataType::i8: return launch_scale<std::int8_t>(r, s, k);
    case DataType::u8: return launch_scale<std::uint8_t>(r, s, k);
    case DataType::i32: return launch_scale<std::int32_t>(r, s, k);
    case DataType::i64: return launch_scale<std::int64_t>(r, s, k);
    case DataType::f8e4m3:
    case DataType::f8e5m2: {
      auto* d = static_cast<std::uint8_t*>(r.dst);
      const auto* x = static_cast<const std::uint8_t*>(r.src);
      if (r.dtype == DataType::f8e4m3) scale_fp8<BlockFormat::fp8e4m3><<<grid_for(r.n, 256), 256, 0, s>>>(d, x, r.n, kf);
      else scale_fp8<BlockFormat::fp8e5m2><<<grid_for(r.n, 256), 256, 0, s>>>(d, x, r.n, kf);
      return last_status();
    }
  }
  return kInvalidValue;
}

Status reduce_scaled(const ReduceScaledArgs& r, Stream s) noexcept {
  if (static_cast<int>(r.dtype) >= kNumDataTypes) return kInvalidValue;
  if (r.n == 0) return 0;
  if (!r.dst || !r.a || !r.b) return kInvalidValue;
  const std::int64_t k = integral_factor(r.factor);
  const float kf = static_cast<float>(r.factor);
  switch (r.dtype) {
    case DataType::f32: return launch_reduce_scaled<float>(r, s, kf);
    case DataType::f64: return launch_reduce_scaled<double>(r, s, r.factor);
    case DataType::f16:
    case DataType::bf16: {
      auto* d = static_cast<std::uint16_t*>(r.dst);
      const auto* a = static_cast<const std::uint16_t*>(r.a);
      const auto* b = static_cast<const std::uint16_t*>(r.b);
      if (r.dtype == DataType::f16) reduce_scaled_16<true><<<grid_for(r.n, 256), 256, 0, s>>>(d, a, b, r.n, kf);
      else reduce_scaled_16<false><<<grid_for(r.n, 256), 256, 0, s>>>(d, a, b, r.n, kf);
      return last_status();
    }
    case DataType::i8: return launch_reduce_scaled<std::int8_t>(r, s, k);
    case DataType::u8: return launch_reduce_scaled<std::uint8_t>(r, s, k);
    case DataType::i32: return launch_reduce_scaled<std::int32_t>(r, s, k);
    case DataType::i64: return launch_reduce_scaled<std::int64_t>(r, s, k);
    case DataType::f8e4m3:
    case DataType::f8e5m2: {
      auto* d = static_cast<std::uint8_t*>(r.dst);
      const auto* a = static_cast<const std::uint8_t*>(r.a);
      const auto* b = static_cast<const std::uint8_t*>(r.b);
      if (r.dtype == DataType::f8e4m3)
        reduce_scaled_fp8<BlockFormat::fp8e4m3><<<grid_for(r.n, 256), 256, 0, s>>>(d, a, b, r.n, kf);
      else
        reduce_scaled_fp8<BlockFormat::fp8e5m2><<<grid_for(r.n, 256), 256, 0, s>>>(d, a, b, r.n, kf);
      return last_status();
    }
  }
  return kInvalidValue;
}

}  // namespace braid::kernels::cuda
