// braid CUDA runtime queries. The runtime is linked statically (CUDA::cudart_static) and
// loads libcuda.so itself on first use, so on a host without a driver or GPU these return
// a clean "no device" with the reason instead of failing to load or aborting.
#include "kernels/cuda/cuda_kernels.hpp"

#include <cuda_runtime.h>

namespace braid::kernels::cuda {

std::string status_string(Status s) {
  const auto e = static_cast<cudaError_t>(s);
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

int device_count(std::string* reason, bool* absent) noexcept {
  try {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (absent) *absent = false;
    if (e == cudaSuccess && n > 0) {
      if (reason) reason->clear();
      return n;
    }
    cudaGetLastError();  // the error is sticky for the runtime's last-error slot only
    if (absent)
      *absent = e == cudaSuccess || e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice;
    if (reason) {
      switch (e) {
        case cudaSuccess: *reason = "the CUDA driver reports no devices"; break;
        case cudaErrorInsufficientDriver:
          *reason = "no usable CUDA driver (libcuda.so missing or older than the runtime; this host has no GPU "
                    "driver?): " + status_string(e);
          break;
        case cudaErrorNoDevice: *reason = "no CUDA-capable device: " + status_string(e); break;
        default: *reason = "the CUDA runtime could not start: " + status_string(e); break;
      }
    }
    return 0;
  } catch (...) {
    if (reason) *reason = "out of memory while querying CUDA devices";
    return 0;
  }
}

}  // namespace braid::kernels::cuda
