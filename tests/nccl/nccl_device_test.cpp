// NCCL's C API on device buffers: ncclCommInitAll over braid's emulated device runtime
// (BRAID_GPU_BACKEND=emulated, set by CMake; docs/gpu.md), one GPU and one stream per
// communicator, driven by one thread as NCCL programs do. Calls are stream-ordered: they
// return before the result exists, and synchronizing the stream shows it.
#include <braid/device.hpp>
#include <braid/nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

int g_failures = 0;

#define CHECK(cond)                                                             \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                             \
    }                                                                           \
  } while (0)

#define NCCLCHECK(call)                                                                       \
  do {                                                                                        \
    ncclResult_t r_ = (call);                                                                 \
    if (r_ != ncclSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call,                \
                   ncclGetErrorString(r_), ncclGetLastError(nullptr));                        \
      std::exit(2);                                                                           \
    }                                                                                         \
  } while (0)

constexpr int kRanks = 2;  // the emulated runtime's devices
constexpr std::size_t kCount = 1 << 16;

std::vector<float> read_back(const void* d, std::size_t n) {
  std::vector<float> h(n);
  braid::device::copy(h.data(), d, n * sizeof(float));
  return h;
}

}  // namespace

int main() {
  const int gpus = braid::device::count();
  if (gpus < 1) {
    std::printf("SKIP: no device runtime: %s\n", braid::device::runtime().c_str());
    return 77;
  }
  // Two GPUs where there are two; else both communicators on the one (a stream each).
  int devs[kRanks] = {0, gpus > 1 ? 1 : 0};
  ncclComm_t comms[kRanks];
  NCCLCHECK(ncclCommInitAll(comms, kRanks, devs));
  void* streams[kRanks];
  float* send[kRanks];
  float* recv[kRanks];
  for (int i = 0; i < kRanks; ++i) {
    int dev = -1;
    NCCLCHECK(ncclCommCuDevice(comms[i], &dev));
    CHECK(dev == devs[i]);
    braid::device::set_device(devs[i]);
    streams[i] = braid::device::create_stream();
    NCCLCHECK(ncclMemAlloc(reinterpret_cast<void**>(&send[i]), kCount * sizeof(float)));
    NCCLCHECK(ncclMemAlloc(reinterpret_cast<void**>(&recv[i]), kCount * sizeof(float)));
    CHECK(braid::device::memory_kind(send[i]) == braid::MemoryKind::device);
    std::vector<float> h(kCount);
    for (std::size_t k = 0; k < kCount; ++k) h[k] = static_cast<float>((i + 1) * (k % 100));
    braid::device::copy(send[i], h.data(), kCount * sizeof(float));
  }
  auto stream = [&](int i) { return static_cast<cudaStream_t>(streams[i]); };

  // All-reduce on every communicator in one group; the group returns without waiting.
  NCCLCHECK(ncclGroupStart());
  for (int i = 0; i < kRanks; ++i)
    NCCLCHECK(ncclAllReduce(send[i], recv[i], kCount, ncclFloat, ncclSum, comms[i], stream(i)));
  NCCLCHECK(ncclGroupEnd());
  for (int i = 0; i < kRanks; ++i) braid::device::synchronize(streams[i]);
  for (int i = 0; i < kRanks; ++i) {
    auto h = read_back(recv[i], kCount);
    for (std::size_t k = 0; k < kCount; k += 997) CHECK(h[k] == static_cast<float>(3 * (k % 100)));
  }

  // Point to point with each rank's receive issued before its send, on one stream: the group
  // posts the sends first, as NCCL fuses a group, so neither stream waits for the other.
  NCCLCHECK(ncclGroupStart());
  for (int i = 0; i < kRanks; ++i) {
    NCCLCHECK(ncclRecv(recv[i], kCount, ncclFloat, 1 - i, comms[i], stream(i)));
    NCCLCHECK(ncclSend(send[i], kCount, ncclFloat, 1 - i, comms[i], stream(i)));
  }
  NCCLCHECK(ncclGroupEnd());
  for (int i = 0; i < kRanks; ++i) braid::device::synchronize(streams[i]);
  for (int i = 0; i < kRanks; ++i) {
    auto h = read_back(recv[i], kCount);
    for (std::size_t k = 0; k < kCount; k += 991) CHECK(h[k] == static_cast<float>((2 - i) * (k % 100)));
  }

  // Broadcast and all-gather, stream-ordered one after the other.
  NCCLCHECK(ncclGroupStart());
  for (int i = 0; i < kRanks; ++i) {
    NCCLCHECK(ncclBroadcast(send[i], recv[i], kCount, ncclFloat, 1, comms[i], stream(i)));
    NCCLCHECK(ncclAllGather(send[i], recv[i], kCount / kRanks, ncclFloat, comms[i], stream(i)));
  }
  NCCLCHECK(ncclGroupEnd());
  for (int i = 0; i < kRanks; ++i) braid::device::synchronize(streams[i]);
  for (int i = 0; i < kRanks; ++i) {
    auto h = read_back(recv[i], kCount);
    CHECK(h[5] == 5.0f && h[kCount / 2 + 5] == 10.0f);  // block 1 is rank 1's first half
  }

  // Gather to rank 1, then scatter back from it: rank i ends with its own first half.
  NCCLCHECK(ncclGroupStart());
  for (int i = 0; i < kRanks; ++i) {
    NCCLCHECK(ncclGather(send[i], recv[i], kCount / kRanks, ncclFloat, 1, comms[i], stream(i)));
    NCCLCHECK(ncclScatter(recv[i], send[i], kCount / kRanks, ncclFloat, 1, comms[i], stream(i)));
  }
  NCCLCHECK(ncclGroupEnd());
  for (int i = 0; i < kRanks; ++i) braid::device::synchronize(streams[i]);
  for (int i = 0; i < kRanks; ++i) {
    auto h = read_back(send[i], kCount / kRanks);
    for (std::size_t k = 0; k < kCount / kRanks; k += 101) CHECK(h[k] == static_cast<float>((i + 1) * (k % 100)));
  }

  // Refusals before any byte moves: host and device buffers mixed, another GPU's buffer.
  std::vector<float> host(kCount);
  CHECK(ncclAllReduce(host.data(), recv[0], kCount, ncclFloat, ncclSum, comms[0], stream(0)) == ncclInvalidArgument);
  std::printf("mixed buffers: %s\n", ncclGetLastError(comms[0]));
  if (devs[1] != devs[0]) {
    CHECK(ncclAllReduce(send[1], send[1], kCount, ncclFloat, ncclSum, comms[0], stream(0)) == ncclInvalidArgument);
    std::printf("another GPU's buffer: %s\n", ncclGetLastError(comms[0]));
  }

  for (int i = 0; i < kRanks; ++i) {
    ncclResult_t async = ncclInternalError;
    NCCLCHECK(ncclCommGetAsyncError(comms[i], &async));
    CHECK(async == ncclSuccess);
    NCCLCHECK(ncclCommFinalize(comms[i]));
  }
  for (int i = 0; i < kRanks; ++i) {
    NCCLCHECK(ncclCommDestroy(comms[i]));
    NCCLCHECK(ncclMemFree(send[i]));
    NCCLCHECK(ncclMemFree(recv[i]));
    braid::device::destroy_stream(streams[i]);
  }
  if (g_failures) return 1;
  std::printf("nccl_device_test: passed\n");
  return 0;
}
