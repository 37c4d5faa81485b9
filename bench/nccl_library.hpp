// NCCL loaded at run time (dlopen), for allreduce_bench --backend nccl: braid never builds
// against NCCL. The few entry points the bench calls are declared here from nccl.h's C
// ABI (NCCL 2.x, stable since 2.0): ncclUniqueId is a struct of 128 chars passed by
// value, ncclResult_t / ncclDataType_t / ncclRedOp_t are C enums (int-sized; ncclRedOp_t
// is kept int-sized on purpose, see its ncclMaxRedOp), ncclComm_t is an opaque pointer
// and cudaStream_t is CUstream_st*, passed here as void*.
//
// Not yet run on a GPU in this project (scripts/gpu_check.sh runs it where there is one).
#pragma once

#include <braid/types.hpp>

#include <dlfcn.h>

#include <cstddef>
#include <string>
#include <type_traits>

namespace braid::bench::nccl {

// ncclResult_t values (nccl.h).
enum Result : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
};

/// ncclUniqueId: NCCL_UNIQUE_ID_BYTES (128) opaque bytes.
struct UniqueId {
  char internal[128];
};
static_assert(sizeof(UniqueId) == 128, "ncclUniqueId is 128 bytes");

/// ncclComm_t.
using Comm = struct ncclComm*;

/// ncclDataType_t of a braid type (nccl.h: int8 0, uint8 1, int32 2, int64 4, float16 6,
/// float32 7, float64 8, bfloat16 9, float8e4m3 10, float8e5m2 11).
inline int data_type(DataType t) {
  switch (t) {
    case DataType::i8: return 0;
    case DataType::u8: return 1;
    case DataType::i32: return 2;
    case DataType::i64: return 4;
    case DataType::f16: return 6;
    case DataType::f32: return 7;
    case DataType::f64: return 8;
    case DataType::bf16: return 9;
    case DataType::f8e4m3: return 10;
    case DataType::f8e5m2: return 11;
  }
  return -1;
}

/// ncclRedOp_t of a braid op (nccl.h: sum 0, prod 1, max 2, min 3, avg 4 — avg since 2.10).
inline int red_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return 0;
    case ReduceOp::prod: return 1;
    case ReduceOp::max: return 2;
    case ReduceOp::min: return 3;
    case ReduceOp::avg: return 4;
    case ReduceOp::premul_sum: return -1;  // an operator ncclRedOpCreatePreMulSum makes, not an enum value
  }
  return -1;
}

/// The entry points, resolved from the library given to load().
struct Library {
  void* handle = nullptr;
  Result (*GetVersion)(int* version) = nullptr;
  Result (*GetUniqueId)(UniqueId* id) = nullptr;
  Result (*CommInitRank)(Comm* comm, int nranks, UniqueId id, int rank) = nullptr;
  Result (*CommDestroy)(Comm comm) = nullptr;
  Result (*CommAbort)(Comm comm) = nullptr;
  Result (*CommGetAsyncError)(Comm comm, Result* async_error) = nullptr;
  Result (*AllReduce)(const void* send, void* recv, std::size_t count, int datatype, int op, Comm comm,
                      void* stream) = nullptr;
  const char* (*GetErrorString)(Result r) = nullptr;
  const char* (*GetLastError)(Comm comm) = nullptr;  ///< since 2.13; may be null

  Library() = default;
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  ~Library() {
    if (handle) dlclose(handle);
  }

  /// Opens `path` (a name such as libnccl.so.2 is looked up as dlopen does). Returns ""
  /// or why NCCL cannot be used.
  std::string load(const std::string& path) {
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* e = dlerror();
      return "cannot load " + path + ": " + (e ? e : "dlopen failed");
    }
    std::string missing;
    auto sym = [&](auto& fn, const char* name, bool required) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
      if (!fn && required) missing += std::string(missing.empty() ? "" : ", ") + name;
    };
    sym(GetVersion, "ncclGetVersion", true);
    sym(GetUniqueId, "ncclGetUniqueId", true);
    sym(CommInitRank, "ncclCommInitRank", true);
    sym(CommDestroy, "ncclCommDestroy", true);
    sym(CommAbort, "ncclCommAbort", true);
    sym(CommGetAsyncError, "ncclCommGetAsyncError", true);
    sym(AllReduce, "ncclAllReduce", true);
    sym(GetErrorString, "ncclGetErrorString", true);
    sym(GetLastError, "ncclGetLastError", false);
    if (!missing.empty()) return path + " lacks " + missing + " (not NCCL 2.x?)";
    return "";
  }

  /// "2.28.9" (ncclGetVersion's code: X*10000+Y*100+Z since 2.9, X*1000+Y*100+Z before).
  std::string version() const {
    int v = 0;
    if (GetVersion(&v) != kSuccess) return "unknown version";
    const int major = v >= 10000 ? v / 10000 : v / 1000;
    const int minor = v >= 10000 ? v % 10000 / 100 : v % 1000 / 100;
    return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(v % 100);
  }

  /// "5 (invalid usage (run with NCCL_DEBUG=WARN for details)): <NCCL's last error text>".
  std::string error(Result r, Comm comm = nullptr) const {
    std::string s = std::to_string(static_cast<int>(r)) + " (" + GetErrorString(r) + ")";
    if (GetLastError) {
      const char* last = GetLastError(comm);
      if (last && *last) s += ": " + std::string(last);
    }
    return s;
  }
};

}  // namespace braid::bench::nccl
