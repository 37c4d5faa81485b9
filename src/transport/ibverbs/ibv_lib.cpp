#include "transport/ibverbs/ibv_lib.hpp"

#include "base/dynlib.hpp"

#include <dlfcn.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace braid::transport::ibverbs {
namespace {

struct Loaded {
  Api api;
  std::string why;
  bool ok = false;
};

Loaded load_path(const std::string& library) {
  Loaded l;
  l.api.path = library.empty() ? "libibverbs.so.1" : library;
  void* h = base::open_library(l.api.path,
                               "install rdma-core's libibverbs1 and ibverbs-providers, or point "
                               "BRAID_IBVERBS_LIBRARY at libibverbs.so.1",
                               &l.why);
  if (h == nullptr) return l;
  Api& a = l.api;
  std::string missing;
  base::resolve(h, "ibv_get_device_list", &a.get_device_list, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_free_device_list", &a.free_device_list, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_get_device_name", &a.get_device_name, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_open_device", &a.open_device, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_close_device", &a.close_device, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_query_device", &a.query_device, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_query_port", &a.query_port_compat, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_query_gid", &a.query_gid, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_alloc_pd", &a.alloc_pd, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_dealloc_pd", &a.dealloc_pd, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_reg_mr", &a.reg_mr, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_dereg_mr", &a.dereg_mr, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_create_comp_channel", &a.create_comp_channel, &missing, "IBVERBS_1.0");
  base::resolve(h, "ibv_destroy_comp_channel", &a.destroy_comp_channel, &missing, "IBVERBS_1.0");
  base::resolve(h, "ibv_create_cq", &a.create_cq, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_destroy_cq", &a.destroy_cq, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_get_cq_event", &a.get_cq_event, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_ack_cq_events", &a.ack_cq_events, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_create_qp", &a.create_qp, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_destroy_qp", &a.destroy_qp, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_modify_qp", &a.modify_qp, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_get_async_event", &a.get_async_event, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_ack_async_event", &a.ack_async_event, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_wc_status_str", &a.wc_status_str, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_event_type_str", &a.event_type_str, &missing, "IBVERBS_1.1");
  base::resolve(h, "ibv_fork_init", &a.fork_init, &missing, "IBVERBS_1.1");
  std::string optional;
  base::resolve(h, "ibv_is_fork_initialized", &a.is_fork_initialized, &optional, "IBVERBS_1.13");
  base::resolve(h, "ibv_reg_dmabuf_mr", &a.reg_dmabuf_mr, &optional, "IBVERBS_1.12");
  if (!missing.empty()) {
    l.why = l.api.path + " has no " + missing + " (not libibverbs, or older than rdma-core's IBVERBS_1.1)";
    ::dlclose(h);
    return l;
  }
  a.file = base::library_file(h, a.path);
  // The handle stays open for the life of the process: providers start threads and keep
  // global state, so unloading libibverbs is never safe.
  l.ok = true;
  return l;
}

}  // namespace

int Api::query_port(ibv_context* context, std::uint8_t port, ibv_port_attr* attr) const {
  // verbs.h's ___ibv_query_port, without its GNU statement expression (verbs_get_ctx_op):
  // the extended op takes the size of the caller's struct, so newer fields are filled too.
  verbs_context* v = verbs_get_ctx(context);
  if (v != nullptr && v->sz >= sizeof(*v) - offsetof(verbs_context, query_port) && v->query_port != nullptr)
    return v->query_port(context, port, attr, sizeof(*attr));
  std::memset(attr, 0, sizeof(*attr));
  return query_port_compat(context, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
}

const Api* load(const std::string& library, std::string* why) {
  static std::mutex mu;
  static auto* loaded = new std::map<std::string, Loaded>();  // never freed: see load_path
  std::lock_guard<std::mutex> lock(mu);
  auto it = loaded->find(library);
  if (it == loaded->end()) it = loaded->emplace(library, load_path(library)).first;
  if (!it->second.ok) {
    if (why) *why = it->second.why;
    return nullptr;
  }
  return &it->second.api;
}

}  // namespace braid::transport::ibverbs
