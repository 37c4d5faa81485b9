// libbraid_nccl: NCCL's C API (include/braid/nccl.h) over braid's public C++ API.
//
// A thin translation, nothing of its own to run: each call maps its enums, classifies its
// buffers once (device or host), posts braid's collective and decides where completion is
// awaited: device calls are stream-ordered and return at once (their Works are kept for
// ncclCommGetAsyncError and ncclCommFinalize); host calls wait here, or at the outermost
// ncclGroupEnd when inside a group. Every braid::Error becomes an ncclResult_t and its
// message the thread's ncclGetLastError.
#include <braid/nccl.h>

#include <braid/communicator.hpp>
#include <braid/device.hpp>
#include <braid/error.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

static_assert(sizeof(ncclUniqueId) == sizeof(braid::UniqueId), "ncclUniqueId is braid's UniqueId");
static_assert(offsetof(ncclConfig_t, blocking) == 16, "ncclConfig_t follows NCCL 2.28's layout");

struct ncclComm {
  ncclComm(braid::Communicator c, int dev) : comm(std::move(c)), device(dev) {}
  braid::Communicator comm;
  int device;
  std::mutex mu;
  std::vector<braid::Work> in_flight;  // device calls not yet seen complete
  ncclResult_t async_error = ncclSuccess;
  bool revoked = false;  // by ncclCommRevoke or NCCL_SHRINK_ABORT, not by a failure
  // Operators of ncclRedOpCreatePreMulSum: operator ncclNumOps + i is premul[i] (its datatype
  // and factor; a destroyed one has live false and its number is reused).
  struct PreMul {
    bool live = false;
    int datatype = 0;
    double scale = 1.0;
  };
  std::vector<PreMul> premul;
};

namespace {

using braid::DataType;
using braid::MemoryKind;
using braid::ReduceOp;
using braid::Work;

constexpr unsigned kConfigMagic = 0xcafebeef;

thread_local std::string t_last_error;
// Group state of this thread: depth, host operations to await at the outermost end, device
// point-to-point deferred to the end (sends are posted before receives there, as NCCL fuses
// a group), and the group's first error.
struct DeferredP2P {
  ncclComm* comm;
  bool send;
  void* buf;
  std::size_t count;
  DataType type;
  int peer;
  cudaStream_t stream;
};
thread_local int t_group_depth = 0;
thread_local std::vector<std::pair<ncclComm*, Work>> t_group_host;
thread_local std::vector<DeferredP2P> t_group_p2p;
thread_local ncclResult_t t_group_error = ncclSuccess;

ncclResult_t fail(ncclResult_t r, std::string message) {
  t_last_error = std::move(message);
  if (t_group_depth > 0 && t_group_error == ncclSuccess) t_group_error = r;
  return r;
}

ncclResult_t result_of(braid::ErrorCode code) {
  switch (code) {
    case braid::ErrorCode::InvalidUsage:
    case braid::ErrorCode::Unsupported:
      return ncclInvalidArgument;
    case braid::ErrorCode::Timeout:
    case braid::ErrorCode::RemoteError:
    case braid::ErrorCode::Network:
      return ncclRemoteError;
    case braid::ErrorCode::Aborted:
      return ncclInvalidUsage;
    case braid::ErrorCode::System:
      return ncclSystemError;
    case braid::ErrorCode::Cuda:
      return ncclUnhandledCudaError;
    case braid::ErrorCode::Internal:
      break;
  }
  return ncclInternalError;
}

// Remembers the first failure that broke the communicator, for ncclCommGetAsyncError.
void note_failure(ncclComm* c, ncclResult_t r) {
  if (!c || r == ncclInvalidArgument || r == ncclInvalidUsage) return;
  std::lock_guard<std::mutex> lock(c->mu);
  if (c->async_error == ncclSuccess) c->async_error = r;
}

// Runs `f` and turns what it throws into a result; `c` (may be null) learns of failures.
template <class F>
ncclResult_t guarded(ncclComm* c, F&& f) {
  try {
    return f();
  } catch (const braid::Error& e) {
    ncclResult_t r = result_of(e.code());
    // Aborted: the communicator failed before this call (a peer died during the tuner's
    // trials, say), unless this program revoked it.
    if (e.code() == braid::ErrorCode::Aborted && c && !c->revoked) r = ncclRemoteError;
    note_failure(c, r);
    return fail(r, e.what());
  } catch (const std::bad_alloc&) {
    return fail(ncclSystemError, "out of host memory");
  } catch (const std::exception& e) {
    return fail(ncclInternalError, e.what());
  } catch (...) {
    return fail(ncclInternalError, "unknown exception");
  }
}

// guarded() for calls on a communicator: a null one is refused first.
template <class F>
ncclResult_t on_comm(ncclComm* c, const char* what, F&& f) {
  if (!c) return fail(ncclInvalidArgument, std::string(what) + ": comm is NULL");
  return guarded(c, std::forward<F>(f));
}

// The integer a C caller passed for an NCCL enum. C lets any int through; C++ may not load
// an enum object holding a value outside its range (UBSan's -fsanitize=enum), so every
// enum argument is read through this, by address, before it is checked.
template <class Enum>
int raw(const Enum& e) {
  static_assert(sizeof(Enum) == sizeof(int), "NCCL's enums are int-sized");
  int v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

// The braid type that moves NCCL type `t`'s bytes (unsigned 32/64-bit types as their
// signed kin, which sum and multiply to the same bits).
ncclResult_t movement(const char* what, int t, DataType* out) {
  static constexpr DataType kTypes[ncclNumTypes] = {
      DataType::i8,  DataType::u8,  DataType::i32,  DataType::i32,    DataType::i64,   DataType::i64,
      DataType::f16, DataType::f32, DataType::f64,  DataType::bf16,   DataType::f8e4m3, DataType::f8e5m2};
  if (t < 0 || t >= ncclNumTypes)
    return fail(ncclInvalidArgument, std::string(what) + ": invalid datatype " + std::to_string(t));
  *out = kTypes[t];
  return ncclSuccess;
}

ncclResult_t reduction(const char* what, int t, int op, DataType* out, ReduceOp* rop) {
  if (ncclResult_t r = movement(what, t, out)) return r;
  if (op < 0 || op >= ncclNumOps)
    return fail(ncclInvalidArgument, std::string(what) + ": reduction operator " + std::to_string(op) +
                                         " is not one of NCCL's built-in ones");
  static constexpr ReduceOp kOps[ncclNumOps] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::max, ReduceOp::min,
                                                ReduceOp::avg};
  *rop = kOps[op];
  bool unsigned_wide = t == ncclUint32 || t == ncclUint64;
  if (unsigned_wide && op != ncclSum && op != ncclProd)
    return fail(ncclInvalidArgument, std::string(what) + ": braid reduces ncclUint32/ncclUint64 with "
                                                         "ncclSum and ncclProd only");
  return ncclSuccess;
}

// reduction() for operator `op` of `c`, which may be one of its ncclRedOpCreatePreMulSum
// operators: then *rop is premul_sum and *scale its factor (1 otherwise).
ncclResult_t reduction_of(const ncclComm* c, const char* what, int t, int op, DataType* out, ReduceOp* rop,
                          double* scale) {
  *scale = 1.0;
  if (op < ncclNumOps || c == nullptr) return reduction(what, t, op, out, rop);
  const auto i = static_cast<std::size_t>(op - ncclNumOps);
  if (i >= c->premul.size() || !c->premul[i].live)
    return fail(ncclInvalidArgument, std::string(what) + ": reduction operator " + std::to_string(op) +
                                         " is neither built in nor a live ncclRedOpCreatePreMulSum operator of "
                                         "this communicator");
  if (c->premul[i].datatype != t)
    return fail(ncclInvalidArgument, std::string(what) + ": operator " + std::to_string(op) +
                                         " was created for datatype " + std::to_string(c->premul[i].datatype) +
                                         ", the call passes " + std::to_string(t));
  if (ncclResult_t r = reduction(what, t, ncclSum, out, rop)) return r;
  *rop = ReduceOp::premul_sum;
  *scale = c->premul[i].scale;
  return ncclSuccess;
}

// The value of a host scalar of NCCL type `t`, as a double.
bool scalar_value(const void* p, int t, double* v) {
  auto half_bits = [](std::uint16_t h, bool bf) {
    std::uint32_t u;
    if (bf) {
      u = static_cast<std::uint32_t>(h) << 16;
    } else {  // binary16 -> binary32 (exact)
      const std::uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu;
      if (e == 0x1f) {
        const double x = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
        return sign ? -x : x;
      }
      const double mag = e == 0 ? std::ldexp(static_cast<double>(m), -24) : std::ldexp(1.0 + m / 1024.0, static_cast<int>(e) - 15);
      return sign ? -mag : mag;
    }
    float f;
    std::memcpy(&f, &u, 4);
    return static_cast<double>(f);
  };
  switch (t) {
    case ncclInt8: *v = *static_cast<const std::int8_t*>(p); return true;
    case ncclUint8: *v = *static_cast<const std::uint8_t*>(p); return true;
    case ncclInt32: *v = *static_cast<const std::int32_t*>(p); return true;
    case ncclUint32: *v = *static_cast<const std::uint32_t*>(p); return true;
    case ncclInt64: *v = static_cast<double>(*static_cast<const std::int64_t*>(p)); return true;
    case ncclUint64: *v = static_cast<double>(*static_cast<const std::uint64_t*>(p)); return true;
    case ncclFloat16: *v = half_bits(*static_cast<const std::uint16_t*>(p), false); return true;
    case ncclFloat32: *v = *static_cast<const float*>(p); return true;
    case ncclFloat64: *v = *static_cast<const double*>(p); return true;
    case ncclBfloat16: *v = half_bits(*static_cast<const std::uint16_t*>(p), true); return true;
    default: return false;
  }
}

MemoryKind kind_of(std::initializer_list<const void*> buffers) {
  for (const void* p : buffers)
    if (p && braid::device::memory_kind(p) == MemoryKind::device) return MemoryKind::device;
  return MemoryKind::host;
}

template <class Options>
Options options_for(MemoryKind kind, cudaStream_t stream) {
  Options o;
  o.memory = kind;
  o.stream = static_cast<void*>(stream);
  return o;
}

// Where completion is awaited (see the file's comment). Works posted together are all
// awaited even when one fails; the first failure is rethrown.
ncclResult_t finish(ncclComm* c, MemoryKind kind, std::vector<Work> works) {
  if (kind == MemoryKind::device) {
    std::lock_guard<std::mutex> lock(c->mu);
    auto done = [](const Work& w) { return w.test() && !w.exception(); };
    c->in_flight.erase(std::remove_if(c->in_flight.begin(), c->in_flight.end(), done), c->in_flight.end());
    for (Work& w : works) c->in_flight.push_back(std::move(w));
    return ncclSuccess;
  }
  if (t_group_depth > 0) {
    for (Work& w : works) t_group_host.emplace_back(c, std::move(w));
    return ncclSuccess;
  }
  std::exception_ptr first;
  for (const Work& w : works) {
    try {
      w.wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
  return ncclSuccess;
}

ncclResult_t check_config(const char* what, const ncclConfig_t* config) {
  if (!config) return ncclSuccess;
  if (config->magic != kConfigMagic || config->size < offsetof(ncclConfig_t, blocking) + sizeof(int))
    return fail(ncclInvalidArgument, std::string(what) + ": config was not made with NCCL_CONFIG_INITIALIZER");
  if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 && config->blocking != 1)
    return fail(ncclInvalidArgument, std::string(what) + ": config->blocking must be 0 or 1");
  return ncclSuccess;
}

ncclResult_t init_rank(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank, const ncclConfig_t* config) {
  const char* what = "ncclCommInitRank";
  if (!out) return fail(ncclInvalidArgument, std::string(what) + ": comm is NULL");
  *out = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, std::string(what) + ": rank " + std::to_string(rank) + " of " +
                                         std::to_string(nranks) + " ranks is out of range");
  if (ncclResult_t r = check_config(what, config)) return r;
  return guarded(nullptr, [&] {
    braid::UniqueId bid;
    std::memcpy(bid.bytes.data(), id.internal, sizeof(id.internal));
    auto comm = braid::Communicator::from_unique_id(bid, rank, nranks);
    *out = new ncclComm(std::move(comm), braid::device::current_device());
    return ncclSuccess;
  });
}

// One collective call: the communicator checked, then the call's types (`check`, which
// reports what is wrong), the buffers classified once, and `post` given the options for
// their memory kind; completion is awaited where finish() says.
template <class Options, class Check, class Post>
ncclResult_t collective(ncclComm* c, const char* what, const void* send, const void* recv, cudaStream_t stream,
                        Check&& check, Post&& post) {
  return on_comm(c, what, [&] {
    if (ncclResult_t r = check()) return r;
    MemoryKind kind = kind_of({send, recv});
    return finish(c, kind, {post(options_for<Options>(kind, stream))});
  });
}

ncclResult_t post_p2p(ncclComm* c, bool send, void* buf, std::size_t count, DataType t, int peer,
                      cudaStream_t stream, MemoryKind kind) {
  auto o = options_for<braid::P2POptions>(kind, stream);
  Work w = send ? c->comm.send(buf, count, t, peer, o) : c->comm.recv(buf, count, t, peer, o);
  return finish(c, kind, {std::move(w)});
}

ncclResult_t p2p(const char* what, bool send, void* buf, std::size_t count, const ncclDataType_t& dt, int peer,
                 ncclComm* c, cudaStream_t stream) {
  return on_comm(c, what, [&] {
    DataType t;
    if (ncclResult_t r = movement(what, raw(dt), &t)) return r;
    if (peer < 0 || peer >= c->comm.size())
      return fail(ncclInvalidArgument, std::string(what) + ": peer " + std::to_string(peer) + " of " +
                                           std::to_string(c->comm.size()) + " ranks is out of range");
    const MemoryKind kind = kind_of({buf});
    if (t_group_depth > 0 && kind == MemoryKind::device) {
      t_group_p2p.push_back({c, send, buf, count, t, peer, stream});
      return ncclSuccess;
    }
    return post_p2p(c, send, buf, count, t, peer, stream, kind);
  });
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (!uniqueId) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  return guarded(nullptr, [&] {
    braid::UniqueId id = braid::Communicator::create_unique_id();
    std::memcpy(uniqueId->internal, id.bytes.data(), sizeof(uniqueId->internal));
    return ncclSuccess;
  });
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (raw(result)) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (see ncclGetLastError)";
    case ncclSystemError: return "unhandled system error (see ncclGetLastError)";
    case ncclInternalError: return "internal error - please report this issue to braid's developers";
    case ncclInvalidArgument: return "invalid argument (see ncclGetLastError)";
    case ncclInvalidUsage: return "invalid usage (see ncclGetLastError)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) { return t_last_error.c_str(); }

ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  if (!ptr) return fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
  *ptr = nullptr;
  if (braid::device::count() == 0)
    return fail(ncclSystemError, "ncclMemAlloc: no device runtime (" + braid::device::runtime() + ")");
  return guarded(nullptr, [&] {
    *ptr = braid::device::alloc(size);
    return ncclSuccess;
  });
}

ncclResult_t ncclMemFree(void* ptr) {
  braid::device::free(ptr);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return init_rank(comm, nranks, commId, rank, nullptr);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  return init_rank(comm, nranks, commId, rank, config);
}

ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId* commIds, ncclConfig_t* config) {
  if (nId < 1 || !commIds) return fail(ncclInvalidArgument, "ncclCommInitRankScalable: no unique id given");
  return init_rank(newcomm, nranks, commIds[0], myrank, config);
}

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (!comms || ndev < 1) return fail(ncclInvalidArgument, "ncclCommInitAll: comms is NULL or ndev < 1");
  std::fill(comms, comms + ndev, nullptr);
  const bool devices = braid::device::count() > 0;
  const int previous = devices ? braid::device::current_device() : -1;
  ncclResult_t r = guarded(nullptr, [&] {
    braid::UniqueId id = braid::Communicator::create_unique_id();
    for (int i = 0; i < ndev; ++i) {
      braid::CommOptions o;
      if (devices) {
        o.device = devlist ? devlist[i] : i;
        braid::device::set_device(o.device);
      }
      comms[i] = new ncclComm(braid::Communicator::from_unique_id(id, i, ndev, o), o.device);
    }
    return ncclSuccess;
  });
  if (devices) guarded(nullptr, [&] { braid::device::set_device(previous); return ncclSuccess; });
  if (r != ncclSuccess) {
    for (int i = 0; i < ndev; ++i) {
      if (comms[i]) comms[i]->comm.abort();
      delete comms[i];
      comms[i] = nullptr;
    }
  }
  return r;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return on_comm(comm, "ncclCommFinalize", [&] {
    std::vector<Work> works;
    {
      std::lock_guard<std::mutex> lock(comm->mu);
      works.swap(comm->in_flight);
    }
    return finish(comm, MemoryKind::host, std::move(works));
  });
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  delete comm;  // waits for this rank's outstanding calls, up to their deadlines
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  comm->comm.abort();
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  return on_comm(comm, "ncclCommRevoke", [&] {
    if (revokeFlags != NCCL_REVOKE_DEFAULT) return fail(ncclInvalidArgument, "ncclCommRevoke: revokeFlags must be 0");
    comm->revoked = true;
    comm->comm.revoke();
    return ncclSuccess;
  });
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  return on_comm(comm, "ncclCommSplit", [&] {
    if (!newcomm) return fail(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
    *newcomm = nullptr;
    if (color < NCCL_SPLIT_NOCOLOR || color == INT_MAX)
      return fail(ncclInvalidArgument, "ncclCommSplit: color must be >= 0 and < INT_MAX, or NCCL_SPLIT_NOCOLOR");
    if (ncclResult_t r = check_config("ncclCommSplit", config)) return r;
    // braid's split has every rank join some child: the ranks without a color meet in one
    // that is dropped at once.
    braid::Communicator child = comm->comm.split(color == NCCL_SPLIT_NOCOLOR ? INT_MAX : color, key);
    if (color != NCCL_SPLIT_NOCOLOR) *newcomm = new ncclComm(std::move(child), comm->device);
    return ncclSuccess;
  });
}

ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                            ncclConfig_t* config, int shrinkFlags) {
  return on_comm(comm, "ncclCommShrink", [&] {
    if (!newcomm) return fail(ncclInvalidArgument, "ncclCommShrink: newcomm is NULL");
    *newcomm = nullptr;
    if (excludeRanksCount < 0 || (excludeRanksCount > 0 && !excludeRanksList))
      return fail(ncclInvalidArgument, "ncclCommShrink: excludeRanksList is NULL or its count negative");
    if (shrinkFlags & ~NCCL_SHRINK_ABORT)
      return fail(ncclInvalidArgument, "ncclCommShrink: shrinkFlags must be NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT");
    if (ncclResult_t r = check_config("ncclCommShrink", config)) return r;
    if (shrinkFlags & NCCL_SHRINK_ABORT) {
      comm->revoked = true;
      comm->comm.abort();
    }
    std::vector<int> exclude(excludeRanksList, excludeRanksList + excludeRanksCount);
    *newcomm = new ncclComm(comm->comm.shrink(exclude), comm->device);
    return ncclSuccess;
  });
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (!comm || !asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: comm or asyncError is NULL");
  std::lock_guard<std::mutex> lock(comm->mu);
  auto& works = comm->in_flight;
  for (auto it = works.begin(); it != works.end();) {
    if (!it->test()) {
      ++it;
      continue;
    }
    if (std::exception_ptr e = it->exception()) {
      try {
        std::rethrow_exception(e);
      } catch (const braid::Error& err) {
        if (comm->async_error == ncclSuccess) comm->async_error = result_of(err.code());
        t_last_error = err.what();
      } catch (...) {
        if (comm->async_error == ncclSuccess) comm->async_error = ncclInternalError;
      }
    }
    it = works.erase(it);
  }
  *asyncError = comm->async_error;
  if (*asyncError == ncclSuccess && comm->comm.failed() && !comm->revoked) *asyncError = ncclRemoteError;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!comm || !count) return fail(ncclInvalidArgument, "ncclCommCount: comm or count is NULL");
  *count = comm->comm.size();
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (!comm || !device) return fail(ncclInvalidArgument, "ncclCommCuDevice: comm or device is NULL");
  *device = comm->device;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!comm || !rank) return fail(ncclInvalidArgument, "ncclCommUserRank: comm or rank is NULL");
  *rank = comm->comm.rank();
  return ncclSuccess;
}

// braid needs no registration: the handle is the buffer itself.
ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t, void** handle) {
  if (!comm || !handle) return fail(ncclInvalidArgument, "ncclCommRegister: comm or handle is NULL");
  *handle = buff;
  return ncclSuccess;
}

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void*) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommDeregister: comm is NULL");
  return ncclSuccess;
}

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  const char* what = "ncclRedOpCreatePreMulSum";
  if (!op || !scalar || !comm) return fail(ncclInvalidArgument, std::string(what) + ": op, scalar or comm is NULL");
  const int t = raw(datatype), where = raw(residence);
  DataType type;
  ReduceOp sum;
  if (ncclResult_t r = reduction(what, t, ncclSum, &type, &sum)) return r;
  if (where == ncclScalarDevice)
    return fail(ncclInvalidArgument, std::string(what) + ": ncclScalarDevice (a factor read from device memory "
                                                         "when each collective runs) is not supported yet; pass "
                                                         "ncclScalarHostImmediate");
  if (where != ncclScalarHostImmediate)
    return fail(ncclInvalidArgument, std::string(what) + ": invalid residence " + std::to_string(where));
  double v = 1.0;
  if (!scalar_value(scalar, t, &v))
    return fail(ncclInvalidArgument, std::string(what) + ": no premultiplied sum for datatype " + std::to_string(t));
  std::lock_guard<std::mutex> lock(comm->mu);
  std::size_t i = 0;
  while (i < comm->premul.size() && comm->premul[i].live) ++i;
  if (i == comm->premul.size()) comm->premul.emplace_back();
  comm->premul[i] = {true, t, v};
  *op = static_cast<ncclRedOp_t>(ncclNumOps + static_cast<int>(i));
  return ncclSuccess;
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  const int o = raw(op);
  if (!comm) return fail(ncclInvalidArgument, "ncclRedOpDestroy: comm is NULL");
  std::lock_guard<std::mutex> lock(comm->mu);
  const auto i = static_cast<std::size_t>(o - ncclNumOps);
  if (o < ncclNumOps || i >= comm->premul.size() || !comm->premul[i].live)
    return fail(ncclInvalidArgument, "ncclRedOpDestroy: operator " + std::to_string(o) +
                                         " was not made by ncclRedOpCreatePreMulSum on this communicator (or "
                                         "was destroyed already)");
  comm->premul[i].live = false;
  return ncclSuccess;
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  DataType t;
  ReduceOp o;
  double scale = 1.0;
  return collective<braid::ReduceOptions>(
      comm, "ncclReduce", sendbuff, recvbuff, stream,
      [&] { return reduction_of(comm, "ncclReduce", raw(datatype), raw(op), &t, &o, &scale); },
      [&](braid::ReduceOptions opts) {
        opts.root = root;
        opts.scale = scale;
        return comm->comm.reduce(sendbuff, recvbuff, count, t, o, opts);
      });
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  DataType t;
  return collective<braid::BroadcastOptions>(
      comm, "ncclBroadcast", sendbuff, recvbuff, stream, [&] { return movement("ncclBroadcast", raw(datatype), &t); },
      [&](braid::BroadcastOptions opts) {
        opts.root = root;
        return comm->comm.broadcast(sendbuff, recvbuff, count, t, opts);
      });
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  DataType t;  // not through ncclBroadcast: that would copy the enum argument (see raw())
  return collective<braid::BroadcastOptions>(
      comm, "ncclBcast", buff, buff, stream, [&] { return movement("ncclBcast", raw(datatype), &t); },
      [&](braid::BroadcastOptions opts) {
        opts.root = root;
        return comm->comm.broadcast(buff, buff, count, t, opts);
      });
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  DataType t;
  ReduceOp o;
  double scale = 1.0;
  return collective<braid::AllreduceOptions>(
      comm, "ncclAllReduce", sendbuff, recvbuff, stream,
      [&] { return reduction_of(comm, "ncclAllReduce", raw(datatype), raw(op), &t, &o, &scale); },
      [&](braid::AllreduceOptions opts) {
        opts.scale = scale;
        return comm->comm.allreduce(sendbuff, recvbuff, count, t, o, opts);
      });
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  DataType t;
  ReduceOp o;
  double scale = 1.0;
  return collective<braid::ReduceScatterOptions>(
      comm, "ncclReduceScatter", sendbuff, recvbuff, stream,
      [&] { return reduction_of(comm, "ncclReduceScatter", raw(datatype), raw(op), &t, &o, &scale); },
      [&](braid::ReduceScatterOptions opts) {
        opts.scale = scale;
        return comm->comm.reduce_scatter(sendbuff, recvbuff, recvcount, t, o, opts);
      });
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  DataType t;
  return collective<braid::AllgatherOptions>(
      comm, "ncclAllGather", sendbuff, recvbuff, stream, [&] { return movement("ncclAllGather", raw(datatype), &t); },
      [&](const braid::AllgatherOptions& opts) { return comm->comm.allgather(sendbuff, recvbuff, sendcount, t, opts); });
}

ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                          ncclComm_t comm, cudaStream_t stream) {
  DataType t;
  return collective<braid::AlltoallOptions>(
      comm, "ncclAlltoAll", sendbuff, recvbuff, stream, [&] { return movement("ncclAlltoAll", raw(datatype), &t); },
      [&](const braid::AlltoallOptions& opts) { return comm->comm.alltoall(sendbuff, recvbuff, count, t, opts); });
}

ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream) {
  DataType t;
  return collective<braid::GatherOptions>(
      comm, "ncclGather", sendbuff, recvbuff, stream, [&] { return movement("ncclGather", raw(datatype), &t); },
      [&](braid::GatherOptions opts) {
        opts.root = root;
        return comm->comm.gather(sendbuff, recvbuff, count, t, opts);
      });
}

ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                         ncclComm_t comm, cudaStream_t stream) {
  DataType t;
  return collective<braid::ScatterOptions>(
      comm, "ncclScatter", sendbuff, recvbuff, stream, [&] { return movement("ncclScatter", raw(datatype), &t); },
      [&](braid::ScatterOptions opts) {
        opts.root = root;
        return comm->comm.scatter(sendbuff, recvbuff, count, t, opts);
      });
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return p2p("ncclSend", true, const_cast<void*>(sendbuff), count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return p2p("ncclRecv", false, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclGroupStart(void) {
  if (t_group_depth == 0) t_group_error = ncclSuccess;
  ++t_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (t_group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_group_depth > 0) return ncclSuccess;
  ncclResult_t result = t_group_error;
  auto keep = [&result](ncclResult_t r) {
    if (result == ncclSuccess) result = r;
  };
  // Device point-to-point of the group: every send before any receive, each in its order.
  std::vector<DeferredP2P> p2p;
  p2p.swap(t_group_p2p);
  std::stable_partition(p2p.begin(), p2p.end(), [](const DeferredP2P& d) { return d.send; });
  for (const DeferredP2P& d : p2p) {
    keep(guarded(d.comm, [&] {
      return post_p2p(d.comm, d.send, d.buf, d.count, d.type, d.peer, d.stream, MemoryKind::device);
    }));
  }
  std::vector<std::pair<ncclComm*, Work>> host;
  host.swap(t_group_host);
  for (auto& h : host) {  // (clang before C++20 cannot capture a structured binding)
    const Work& work = h.second;
    keep(guarded(h.first, [&work] {
      work.wait();
      return ncclSuccess;
    }));
  }
  t_group_error = ncclSuccess;
  return result;
}

}  // extern "C"
