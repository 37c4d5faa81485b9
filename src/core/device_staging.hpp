// Device buffers in collectives, first version (docs/gpu.md): stream-ordered, staged
// whole through pinned host memory, host-driven (UCC's pattern).
//
// A call on device buffers becomes, on the caller's stream S, in this order:
//   1. copy send (device) -> pinned copy            ordered after the work already on S
//   2. callback: open the engine's gate             the engine may now start the call
//   3. wait until the call's host word is set       set by the engine when the call ends
//   4. copy pinned copy -> recv (device)
//   5. callback: complete the caller's Work, recycle the pinned copy and the word
// and, on the engine, a gate (core::Operation::gate) followed by the call itself run on
// the pinned copy by the host path, unchanged. When the call ends — done, failed, timed
// out or aborted — its Work's completion sets the word, so S never hangs on a failed
// call (its recv is then undefined, and the Work throws). Work::wait() returns once the
// result is in recv (after step 5). No kernel spins on another rank: the only wait on S
// is on this rank's own host word.
//
// A call that reads no device memory (recv, broadcast off the root) skips steps 1-2 and
// the gate: it runs on the host at once, and only step 4 puts its result in place.
// Point-to-point on one stream therefore behaves as NCCL's outside a group: a recv
// issued before the send it depends on holds that send back (the stream waits for the
// recv first), so issue the sends first, or use two streams.
//
// One part with one job (core/comm_parts.hpp): it owns the pinned copies and words of its
// communicator; it is told how to post the gate and the host call.
#pragma once

#include "gpu/runtime.hpp"

#include <braid/types.hpp>
#include <braid/work.hpp>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace braid::core {

/// The buffers of one call and how many bytes of each the call reads or writes.
struct CallBuffers {
  const void* send = nullptr;
  std::size_t send_bytes = 0;
  void* recv = nullptr;
  std::size_t recv_bytes = 0;
};

class DeviceStaging {
 public:
  /// `device`: the communicator's device (CommOptions::device resolved); `who`: "rank r
  /// of 'name'" for messages.
  DeviceStaging(gpu::Runtime& runtime, int device, std::string who);
  /// Waits (up to 30 s) until every staged call has left its stream, then frees the
  /// pinned memory; what is still in use after that is left allocated (and logged), since
  /// a stream may still copy from it.
  ~DeviceStaging();
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;

  int device() const noexcept { return device_; }
  gpu::Runtime& runtime() const noexcept { return rt_; }

  /// Whether the call's buffers are device buffers (true) or host buffers (false), by
  /// `declared` or by asking the runtime. Throws InvalidUsage, before anything moves, for
  /// a mix of host and device buffers, a buffer of another device, or `device` declared
  /// for host memory; Unsupported for a stream under graph capture.
  bool on_device(const char* what, const CallBuffers& b, MemoryKind declared, gpu::Stream stream);

  /// Posts a device call: `post_gate(gate)` queues the engine's gate, `post_host(send,
  /// recv)` posts the call on pinned copies of the buffers (with the same in-place layout)
  /// and returns its Work. Then enqueues the stream's part. Returns the Work the caller
  /// sees (complete once the result is in recv). If post_host throws, the gate is
  /// opened, nothing is enqueued, and the error passes through. If enqueueing on the
  /// stream fails, `fail(reason)` is called (it must fail the communicator) and the
  /// error is thrown.
  Work post(const char* what, const CallBuffers& b, gpu::Stream stream,
            const std::function<void(std::shared_ptr<std::atomic<bool>>)>& post_gate,
            const std::function<Work(const void*, void*)>& post_host, const std::function<void()>& wake,
            const std::function<void(const std::string&)>& fail);

  /// Staged calls not yet released by their stream (tests).
  int outstanding() const;

 private:
  struct Stage;
  struct Block;
  static void on_staged(void* stage) noexcept;
  static void on_released(void* stage) noexcept;
  std::byte* take(std::size_t bytes);
  void give(std::byte* p, std::size_t bytes) noexcept;
  std::uint32_t* take_word();

  gpu::Runtime& rt_;
  int device_;
  std::string who_;
  mutable std::mutex mu_;
  std::condition_variable idle_cv_;
  int outstanding_ = 0;
  /// Pinned buffers not in use, by size (reused by the next call of that size or smaller).
  std::vector<std::pair<std::size_t, std::byte*>> free_;
  std::vector<std::pair<std::size_t, std::byte*>> all_;
  /// Host words in pinned memory: one per call in flight; each keeps its last value.
  std::vector<std::uint32_t*> free_words_;
  std::vector<std::uint32_t*> word_blocks_;
};

}  // namespace braid::core
