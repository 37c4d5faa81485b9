// braid/device.hpp: the public face of the device runtime (src/gpu) that core::gpu_runtime()
// chose for this process.
#include <braid/device.hpp>

#include "core/config.hpp"
#include "gpu/runtime.hpp"

namespace braid::device {

std::string runtime() { return core::gpu_runtime().describe(); }

int count() noexcept {
  try {
    return core::gpu_runtime().device_count();
  } catch (...) {
    return 0;
  }
}

void set_device(int device) { core::gpu_runtime().set_device(device); }

int current_device() {
  auto& rt = core::gpu_runtime();
  return rt.device_count() > 0 ? rt.current_device() : -1;
}

MemoryKind memory_kind(const void* p) {
  if (!p) return MemoryKind::host;
  return core::gpu_runtime().classify(p).kind;
}

void* alloc(std::size_t bytes, int device) {
  auto& rt = core::gpu_runtime();
  return rt.alloc_device(bytes, device >= 0 ? device : rt.current_device());
}

void free(void* p) noexcept {
  if (!p) return;
  try {
    core::gpu_runtime().free_device(p);
  } catch (...) {
  }
}

void copy(void* dst, const void* src, std::size_t bytes) { core::gpu_runtime().copy(dst, src, bytes); }

void* create_stream() { return core::gpu_runtime().create_stream(); }

void destroy_stream(void* stream) noexcept {
  if (!stream) return;
  try {
    core::gpu_runtime().destroy_stream(stream);
  } catch (...) {
  }
}

void synchronize(void* stream) { core::gpu_runtime().synchronize(stream); }

Counts counts() noexcept { return gpu::counts(); }

}  // namespace braid::device
