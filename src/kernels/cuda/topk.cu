// braid CUDA top-k codec (docs/codecs.md "topk"): correctness first.
//
// Encode: keys = ~(bits(x) & 0x7fffffff) (so that ascending order is descending
// magnitude, NaN > inf > numbers), values = indices; CUB's stable radix sort puts equal
// magnitudes in ascending index order, which is the host's tie-break (lower index wins);
// the first k indices are sorted ascending, then gathered. Workspace layout:
// [keys_in n][keys_out n][idx_in n][idx_out n][sel k] u32, then CUB's temporary storage.
// Decode: a validation kernel (indices < n, strictly ascending) sets *status; the zero
// fill and the scatter only run when it stayed 0.
#include "kernels/cuda/codec_device.cuh"

#include <cub/device/device_radix_sort.cuh>

#include <climits>

namespace braid::kernels::cuda {
BRAID_KERNEL_MODULE()
namespace {
using namespace detail;

BRAID_DEV float value_at(const float* in, const float* add, std::size_t i) {
  return add ? fadd(in[i], add[i]) : in[i];
}

__global__ void topk_keys(const float* in, const float* add, std::uint32_t n, std::uint32_t* keys,
                          std::uint32_t* idx) {
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    keys[i] = ~(f2u(value_at(in, add, i)) & 0x7fffffffu);
    idx[i] = i;
  }
}
__global__ void topk_gather(const float* in, const float* add, const std::uint32_t* sel, std::uint32_t k,
                            std::uint8_t* out) {
  for (std::uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < k; j += gridDim.x * blockDim.x) {
    const std::uint32_t i = sel[j];
    store_u32(out + 4 * static_cast<std::size_t>(j), i);
    store_u32(out + 4 * static_cast<std::size_t>(k) + 4 * static_cast<std::size_t>(j), f2u(value_at(in, add, i)));
  }
}
__global__ void topk_residual(const float* in, const float* add, std::uint32_t n, float* residual) {
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    residual[i] = value_at(in, add, i);
}
__global__ void topk_zero_selected(const std::uint32_t* sel, std::uint32_t k, float* residual) {
  for (std::uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < k; j += gridDim.x * blockDim.x)
    residual[sel[j]] = 0.0f;
}

__global__ void topk_validate(const std::uint8_t* in, std::uint32_t n, std::uint32_t k, int* status, int* rejected) {
  for (std::uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < k; j += gridDim.x * blockDim.x) {
    const std::uint32_t i = load_u32(in + 4 * static_cast<std::size_t>(j));
    const bool bad = i >= n || (j > 0 && i <= load_u32(in + 4 * static_cast<std::size_t>(j - 1)));
    if (bad) {
      *status = 1;  // every writer stores the same value: no atomic needed
      if (rejected) *rejected = 1;
    }
  }
}
__global__ void topk_fill_zero(float* out, std::uint32_t n, const int* status) {
  if (*status != 0) return;
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = 0.0f;
}
template <bool ACC>
__global__ void topk_scatter(const std::uint8_t* in, std::uint32_t k, float* out, const int* status) {
  if (*status != 0) return;
  for (std::uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < k; j += gridDim.x * blockDim.x) {
    const std::uint32_t i = load_u32(in + 4 * static_cast<std::size_t>(j));
    const float v = u2f(load_u32(in + 4 * static_cast<std::size_t>(k) + 4 * static_cast<std::size_t>(j)));
    out[i] = ACC ? fadd(out[i], v) : v;  // indices are distinct: no two threads share i
  }
}

constexpr std::size_t align256(std::size_t x) { return (x + 255) & ~std::size_t{255}; }

int bits_for(std::uint32_t n) {
  int b = 1;
  while (b < 32 && (std::uint64_t{1} << b) < n) ++b;
  return b;
}

// CUB temporary storage for both sorts (the larger of the two).
std::size_t cub_bytes(std::uint32_t n, std::uint32_t k, Status* st) {
  std::size_t a = 0, b = 0;
  cudaError_t e = cub::DeviceRadixSort::SortPairs(nullptr, a, static_cast<const std::uint32_t*>(nullptr),
                                                  static_cast<std::uint32_t*>(nullptr),
                                                  static_cast<const std::uint32_t*>(nullptr),
                                                  static_cast<std::uint32_t*>(nullptr), static_cast<int>(n));
  if (e == cudaSuccess)
    e = cub::DeviceRadixSort::SortKeys(nullptr, b, static_cast<const std::uint32_t*>(nullptr),
                                       static_cast<std::uint32_t*>(nullptr), static_cast<int>(k));
  if (st) *st = static_cast<Status>(e);
  return a > b ? a : b;
}

}  // namespace

std::size_t topk_workspace_bytes(std::size_t n, std::size_t k) noexcept {
  if (n == 0 || n > INT_MAX || k == 0 || k > n) return 0;
  Status st = 0;
  const std::size_t temp = cub_bytes(static_cast<std::uint32_t>(n), static_cast<std::uint32_t>(k), &st);
  if (st != 0) {
    cudaGetLastError();
    return 0;
  }
  return 4 * align256(4 * n) + align256(4 * k) + align256(temp);
}

Status topk_encode(const TopkEncodeArgs& a, Stream s) noexcept {
  if (a.n == 0 || a.n > INT_MAX || a.k == 0 || a.k > a.n || !a.in || !a.out || !a.workspace) return kInvalidValue;
  const auto n = static_cast<std::uint32_t>(a.n), k = static_cast<std::uint32_t>(a.k);
  Status st = 0;
  std::size_t temp = cub_bytes(n, k, &st);
  if (st != 0) return st;
  const std::size_t need = 4 * align256(4 * a.n) + align256(4 * a.k) + align256(temp);
  if (a.workspace_bytes < need) return kInvalidValue;
  auto* base = static_cast<std::uint8_t*>(a.workspace);
  auto* keys_in = reinterpret_cast<std::uint32_t*>(base);
  auto* keys_out = reinterpret_cast<std::uint32_t*>(base + align256(4 * a.n));
  auto* idx_in = reinterpret_cast<std::uint32_t*>(base + 2 * align256(4 * a.n));
  auto* idx_out = reinterpret_cast<std::uint32_t*>(base + 3 * align256(4 * a.n));
  auto* sel = reinterpret_cast<std::uint32_t*>(base + 4 * align256(4 * a.n));
  void* cub_temp = base + 4 * align256(4 * a.n) + align256(4 * a.k);
  const unsigned grid = grid_for(n, 256);
  topk_keys<<<grid, 256, 0, s>>>(a.in, a.add, n, keys_in, idx_in);
  cudaError_t e = cub::DeviceRadixSort::SortPairs(cub_temp, temp, keys_in, keys_out, idx_in, idx_out,
                                                  static_cast<int>(n), 0, 32, s);
  if (e != cudaSuccess) return static_cast<Status>(e);
  e = cub::DeviceRadixSort::SortKeys(cub_temp, temp, idx_out, sel, static_cast<int>(k), 0, bits_for(n), s);
  if (e != cudaSuccess) return static_cast<Status>(e);
  topk_gather<<<grid_for(k, 256), 256, 0, s>>>(a.in, a.add, sel, k, a.out);
  if (a.residual) {
    topk_residual<<<grid, 256, 0, s>>>(a.in, a.add, n, a.residual);
    topk_zero_selected<<<grid_for(k, 256), 256, 0, s>>>(sel, k, a.residual);
  }
  return last_status();
}

Status topk_decode(const TopkDecodeArgs& a, Stream s) noexcept {
  if (a.n > UINT_MAX || a.k > a.n || !a.status || (a.n && (!a.out || (a.k && !a.in)))) return kInvalidValue;
  cudaError_t e = cudaMemsetAsync(a.status, 0, sizeof(int), s);
  if (e != cudaSuccess) return static_cast<Status>(e);
  if (a.n == 0) return 0;
  const auto n = static_cast<std::uint32_t>(a.n), k = static_cast<std::uint32_t>(a.k);
  if (k) topk_validate<<<grid_for(k, 256), 256, 0, s>>>(a.in, n, k, a.status, a.rejected);
  if (!a.accumulate) topk_fill_zero<<<grid_for(n, 256), 256, 0, s>>>(a.out, n, a.status);
  if (k) {
    if (a.accumulate)
      topk_scatter<true><<<grid_for(k, 256), 256, 0, s>>>(a.in, k, a.out, a.status);
    else
      topk_scatter<false><<<grid_for(k, 256), 256, 0, s>>>(a.in, k, a.out, a.status);
  }
  return last_status();
}

}  // namespace braid::kernels::cuda
