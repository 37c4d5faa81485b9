// libibverbs loaded at run time. libibverbs.so.1 is opened with dlopen and the entry points
// braid calls are kept in one table, so that libbraid.so has no NEEDED entry on it, loads
// where rdma-core is absent, and can be pointed at another copy (BRAID_IBVERBS_LIBRARY:
// MOFED's, or a test provider: this table is the seam the verbs transport's tests will use).
// NCCL does the same (src/misc/ibvsymbols.cc).
//
// Only this file and its .cpp (and the discovery that uses the table) include verbs.h: the
// headers are rdma-core's libibverbs-dev (44 here), needed at build time for the types only.
//
// Versioned symbols: rdma-core exports each verb twice, the IBVERBS_1.0 compatibility one
// and the IBVERBS_1.1 default. dlsym finds the default; ibv_query_port is looked up with
// dlvsym(…, "IBVERBS_1.1") as NCCL does, since verbs.h turns it into an inline that prefers
// the context's extended op (Api::query_port below does the same).
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace braid::transport::ibverbs {

/// The verbs entry points braid calls, resolved from the loaded library. Immutable once
/// loaded; share freely between threads.
struct Api {
  std::string path;  ///< what dlopen was given ("libibverbs.so.1" or BRAID_IBVERBS_LIBRARY)
  std::string file;  ///< the file it resolved to ("/usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.44.0")

  // Not decltype(&::ibv_get_device_list) and friends: verbs.h makes some of these names
  // function-like macros, so each type is spelled out from the prototype.
  ibv_device** (*get_device_list)(int* num_devices) = nullptr;
  void (*free_device_list)(ibv_device** list) = nullptr;
  const char* (*get_device_name)(ibv_device* device) = nullptr;
  ibv_context* (*open_device)(ibv_device* device) = nullptr;
  int (*close_device)(ibv_context* context) = nullptr;
  int (*query_device)(ibv_context* context, ibv_device_attr* attr) = nullptr;
  /// The exported ibv_query_port@IBVERBS_1.1 (fills the pre-extension part of the attributes).
  int (*query_port_compat)(ibv_context* context, std::uint8_t port, _compat_ibv_port_attr* attr) = nullptr;
  int (*query_gid)(ibv_context* context, std::uint8_t port, int index, ibv_gid* gid) = nullptr;

  // The verbs transport's entry points (issue 17). ibv_post_send, ibv_post_recv, ibv_poll_cq
  // and ibv_req_notify_cq are verbs.h inlines through the context's ops: no symbol to load.
  ibv_pd* (*alloc_pd)(ibv_context* context) = nullptr;
  int (*dealloc_pd)(ibv_pd* pd) = nullptr;
  ibv_mr* (*reg_mr)(ibv_pd* pd, void* addr, std::size_t length, int access) = nullptr;
  int (*dereg_mr)(ibv_mr* mr) = nullptr;
  ibv_comp_channel* (*create_comp_channel)(ibv_context* context) = nullptr;
  int (*destroy_comp_channel)(ibv_comp_channel* channel) = nullptr;
  ibv_cq* (*create_cq)(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                       int comp_vector) = nullptr;
  int (*destroy_cq)(ibv_cq* cq) = nullptr;
  int (*get_cq_event)(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) = nullptr;
  void (*ack_cq_events)(ibv_cq* cq, unsigned int nevents) = nullptr;
  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr) = nullptr;
  int (*destroy_qp)(ibv_qp* qp) = nullptr;
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) = nullptr;
  int (*get_async_event)(ibv_context* context, ibv_async_event* event) = nullptr;
  void (*ack_async_event)(ibv_async_event* event) = nullptr;
  const char* (*wc_status_str)(ibv_wc_status status) = nullptr;
  const char* (*event_type_str)(ibv_event_type event) = nullptr;
  int (*fork_init)() = nullptr;
  /// Optional (rdma-core 35+): IBV_FORK_UNNEEDED when the kernel makes fork safe by itself.
  ibv_fork_status (*is_fork_initialized)() = nullptr;
  /// Optional (rdma-core 34+, ibv_reg_dmabuf_mr@IBVERBS_1.12): registers `length` bytes at
  /// `offset` into the dma-buf `fd` (GPU memory exported by its driver), addressed in work
  /// requests as `iova` onwards. Null when the library lacks it: GPUDirect RDMA through
  /// dma-buf is then unavailable. A library that has it may still refuse at run time
  /// (EOPNOTSUPP: a kernel or HCA without dma-buf support). Note that libibverbs sets the
  /// returned MR's addr to `offset`, not `iova`: use the iova you passed, not mr->addr.
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd* pd, std::uint64_t offset, std::size_t length, std::uint64_t iova, int fd,
                           int access) = nullptr;

  /// ibv_query_port as verbs.h's inline does it: the context's extended query_port op when
  /// the provider has one, else the exported symbol on zeroed attributes.
  int query_port(ibv_context* context, std::uint8_t port, ibv_port_attr* attr) const;
};

/// Loads `library` ("" = "libibverbs.so.1") once per distinct path per process
/// (thread-safe; the handle is never closed: providers keep threads and global state). Null
/// when it cannot be used, with the reason in *why (the dlopen error with the fix, or the
/// missing entry point). Reads no environment: the caller passes BRAID_IBVERBS_LIBRARY.
const Api* load(const std::string& library, std::string* why);

}  // namespace braid::transport::ibverbs
