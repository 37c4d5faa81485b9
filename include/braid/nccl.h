/* braid — NCCL's C API, served by braid (libbraid_nccl).
 *
 * A program written for NCCL runs on braid by linking -lbraid_nccl instead of -lnccl: the
 * names, argument lists, enum values, the 128-byte ncclUniqueId and ncclConfig_t's layout
 * are NCCL 2.28's, so a program compiled against NCCL's own nccl.h links unchanged (CI
 * builds its C API test both ways, tests/nccl). It needs no CUDA header, and includes
 * CUDA's runtime and fp16/bf16 headers, as NCCL's does, where they are on the include path.
 *
 * What braid adds: host buffers. Where NCCL takes device memory only, braid also takes
 * host memory (malloc'd or pinned), so the same program runs on machines without a GPU.
 * Each buffer is classified by one pointer query (braid::device::memory_kind):
 *   - device buffers: the call is ordered on `stream` as with NCCL and returns without
 *     waiting; synchronize the stream to see the result (docs/gpu.md, stream contract);
 *   - host buffers: `stream` is not used; the call returns once this rank's part is done,
 *     or, inside ncclGroupStart/ncclGroupEnd, ncclGroupEnd returns once every host
 *     operation of the group is done (so a rank may send and receive in one group, and one
 *     thread may drive several communicators, as with NCCL).
 *
 * Semantics and limits, against NCCL (docs/nccl-api.md has the whole table):
 *   - ncclUint32/ncclUint64 reduce with sum and prod (the bits are those of the signed
 *     sum/product); min, max and avg on them, and every reduction of the fp8 types, return
 *     ncclInvalidArgument. fp8 moves (all-gather, broadcast, all-to-all, gather, scatter,
 *     send/recv) as bytes.
 *   - ncclRedOpCreatePreMulSum takes ncclScalarHostImmediate factors (ncclScalarDevice
 *     returns ncclInvalidArgument); the operator works in ncclAllReduce, ncclReduce and
 *     ncclReduceScatter of its communicator and datatype. Integer types need an integral
 *     factor that fits the type.
 *   - ncclCommInitRank's store (the rendezvous) lives in the process that called
 *     ncclGetUniqueId; ncclCommShrink needs that process alive.
 *   - config->blocking = 0 is accepted; calls then complete as in blocking mode (NCCL
 *     allows ncclSuccess instead of ncclInProgress).
 *   - Window registration, ncclGroupSimulateEnd and the profiling names (pnccl*) are not
 *     provided.
 * Errors: a braid error becomes ncclInvalidArgument (bad arguments, nothing sent),
 * ncclRemoteError (a peer died, closed, or missed the deadline BRAID_TIMEOUT),
 * ncclSystemError, ncclUnhandledCudaError, ncclInvalidUsage (the communicator was aborted
 * or failed earlier) or ncclInternalError; ncclGetLastError gives braid's message, which
 * names the collective, the peer and the step.
 */
#ifndef NCCL_H_
#define NCCL_H_
#define BRAID_NCCL_H_ 1

#include <limits.h>
#include <stddef.h>

/* The API level this header follows, and NCCL's version macros at that level. */
#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 0
#define NCCL_SUFFIX "braid"
#define NCCL_VERSION_CODE 22800
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

#if defined(__GNUC__)
#define BRAID_NCCL_API __attribute__((visibility("default")))
#else
#define BRAID_NCCL_API
#endif

/* As NCCL's header does, bring CUDA's runtime and half-precision types where they are on
 * the include path (programs written for NCCL rely on it: nvcc, or -I<cuda>/include);
 * elsewhere only CUDA's own spelling of a stream handle, so that no CUDA header is needed.
 * BRAID_NCCL_NO_CUDA_HEADERS keeps them out. */
#if defined(__has_include) && !defined(BRAID_NCCL_NO_CUDA_HEADERS)
#if __has_include(<cuda_runtime.h>)
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#if __has_include(<cuda_bf16.h>)
#include <cuda_bf16.h>
#endif
#define BRAID_NCCL_CUDA_HEADERS 1
#endif
#endif
#ifdef __cplusplus
extern "C" {
#endif

#ifndef BRAID_NCCL_CUDA_HEADERS
typedef struct CUstream_st* cudaStream_t;
#endif

typedef struct ncclComm* ncclComm_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01
#define NCCL_REVOKE_DEFAULT 0x00

/* NCCL 2.28's layout, field for field: programs built against NCCL's header pass theirs.
 * braid reads `blocking`; the other fields tune NCCL's kernels and are accepted as given. */
typedef struct ncclConfig_v22800 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                              \
  {                                                                                          \
    sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),      \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                 \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,                 \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,                 \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                 \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT                                         \
  }

typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

typedef enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;

/* Version, ids, errors. */
BRAID_NCCL_API ncclResult_t ncclGetVersion(int* version);
BRAID_NCCL_API ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
BRAID_NCCL_API const char* ncclGetErrorString(ncclResult_t result);
BRAID_NCCL_API const char* ncclGetLastError(ncclComm_t comm);

/* Device memory (braid's device runtime; ncclSystemError without one). */
BRAID_NCCL_API ncclResult_t ncclMemAlloc(void** ptr, size_t size);
BRAID_NCCL_API ncclResult_t ncclMemFree(void* ptr);

/* Communicators. */
BRAID_NCCL_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                             int rank);
BRAID_NCCL_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks,
                                                   ncclUniqueId commId, int rank,
                                                   ncclConfig_t* config);
BRAID_NCCL_API ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank,
                                                     int nId, ncclUniqueId* commIds,
                                                     ncclConfig_t* config);
BRAID_NCCL_API ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);
BRAID_NCCL_API ncclResult_t ncclCommFinalize(ncclComm_t comm);
BRAID_NCCL_API ncclResult_t ncclCommDestroy(ncclComm_t comm);
BRAID_NCCL_API ncclResult_t ncclCommAbort(ncclComm_t comm);
BRAID_NCCL_API ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);
BRAID_NCCL_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                          ncclConfig_t* config);
BRAID_NCCL_API ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList,
                                           int excludeRanksCount, ncclComm_t* newcomm,
                                           ncclConfig_t* config, int shrinkFlags);
BRAID_NCCL_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
BRAID_NCCL_API ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
BRAID_NCCL_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
BRAID_NCCL_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
BRAID_NCCL_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size,
                                             void** handle);
BRAID_NCCL_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle);

/* Reduction operators. */
BRAID_NCCL_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar,
                                                     ncclDataType_t datatype,
                                                     ncclScalarResidence_t residence,
                                                     ncclComm_t comm);
BRAID_NCCL_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/* Collectives. */
BRAID_NCCL_API ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, ncclRedOp_t op, int root,
                                       ncclComm_t comm, cudaStream_t stream);
BRAID_NCCL_API ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                                      ncclComm_t comm, cudaStream_t stream);
BRAID_NCCL_API ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                          ncclDataType_t datatype, int root, ncclComm_t comm,
                                          cudaStream_t stream);
BRAID_NCCL_API ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                          ncclDataType_t datatype, ncclRedOp_t op,
                                          ncclComm_t comm, cudaStream_t stream);
BRAID_NCCL_API ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff,
                                              size_t recvcount, ncclDataType_t datatype,
                                              ncclRedOp_t op, ncclComm_t comm,
                                              cudaStream_t stream);
BRAID_NCCL_API ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                          ncclDataType_t datatype, ncclComm_t comm,
                                          cudaStream_t stream);
BRAID_NCCL_API ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                         ncclDataType_t datatype, ncclComm_t comm,
                                         cudaStream_t stream);
BRAID_NCCL_API ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, int root, ncclComm_t comm,
                                       cudaStream_t stream);
BRAID_NCCL_API ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, int root, ncclComm_t comm,
                                        cudaStream_t stream);

/* Point to point. */
BRAID_NCCL_API ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
                                     int peer, ncclComm_t comm, cudaStream_t stream);
BRAID_NCCL_API ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype,
                                     int peer, ncclComm_t comm, cudaStream_t stream);

/* Groups. */
BRAID_NCCL_API ncclResult_t ncclGroupStart(void);
BRAID_NCCL_API ncclResult_t ncclGroupEnd(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_H_ */
