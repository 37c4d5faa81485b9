// Where a plan's regions lie for one call (collectives/plan.hpp's Buffer kinds), shared by
// the engine's host execution and the device path's programs (core::DeviceFlow), which lay
// out a call's buffers alike: scratch, then the packed payloads, frame by frame.
#pragma once

#include "collectives/plan.hpp"
#include "compression/framed.hpp"

#include <cstddef>

namespace braid::core {

/// The address of region `r` of a call: its input and output, the scratch and packed
/// buffers, and the error-feedback residuals; `frame` values of packed payload take
/// `frame_bytes` bytes.
inline std::byte* region_address(const collectives::Region& r, const void* input, void* output, std::byte* scratch,
                                 std::byte* packed, float* const feedback[2], std::size_t elem, std::size_t frame,
                                 std::size_t frame_bytes) {
  using collectives::Buffer;
  switch (r.buf) {
    case Buffer::input: return static_cast<std::byte*>(const_cast<void*>(input)) + r.offset * elem;
    case Buffer::output: return static_cast<std::byte*>(output) + r.offset * elem;
    case Buffer::scratch: return scratch + r.offset * elem;
    case Buffer::packed: return packed + r.offset / frame * frame_bytes;
    case Buffer::feedback_worker: return reinterpret_cast<std::byte*>(feedback[0] + r.offset);
    case Buffer::feedback_owner: return reinterpret_cast<std::byte*>(feedback[1] + r.offset);
  }
  return nullptr;
}

/// Bytes of region `r` (a message's size): packed regions count encoded values.
inline std::size_t region_bytes(const collectives::Region& r, const collectives::Plan& plan, std::size_t elem,
                                std::size_t frame) {
  if (r.buf != collectives::Buffer::packed) return r.count * elem;
  return compression::framed_bytes(plan.request.codec, frame, r.count);
}

}  // namespace braid::core
