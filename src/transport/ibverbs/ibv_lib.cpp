#include "transport/ibverbs/ibv_lib.hpp"

#include <dlfcn.h>
#include <link.h>

#include <climits>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace braid::transport::ibverbs {
namespace {

template <typename F>
void resolve(void* handle, const char* name, const char* version, F* out, std::string* missing) {
  void* sym = version ? ::dlvsym(handle, name, version) : nullptr;
  // A library without symbol versions (a test provider) has only the plain name.
  if (sym == nullptr) sym = ::dlsym(handle, name);
  *out = reinterpret_cast<F>(sym);
  if (sym == nullptr && missing->empty()) *missing = name;
}

struct Loaded {
  Api api;
  std::string why;
  bool ok = false;
};

// The file behind the handle: the link map's name, with symbolic links resolved
// ("libibverbs.so.1" -> ".../libibverbs.so.1.14.44.0", whose suffix is the ABI and
// rdma-core versions).
std::string file_of(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (::dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || map == nullptr || map->l_name == nullptr ||
      map->l_name[0] == '\0')
    return fallback;
  char buf[PATH_MAX];
  if (::realpath(map->l_name, buf) != nullptr) return buf;
  return map->l_name;
}

Loaded load_path(const std::string& library) {
  Loaded l;
  l.api.path = library.empty() ? "libibverbs.so.1" : library;
  // RTLD_LOCAL: verbs symbols stay out of the global namespace (a program may link its own).
  void* h = ::dlopen(l.api.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = ::dlerror();
    l.why = "cannot load " + l.api.path + ": " + (e ? e : "unknown error") +
            " (install rdma-core's libibverbs1 and ibverbs-providers, or point BRAID_IBVERBS_LIBRARY at "
            "libibverbs.so.1)";
    return l;
  }
  Api& a = l.api;
  std::string missing;
  resolve(h, "ibv_get_device_list", "IBVERBS_1.1", &a.get_device_list, &missing);
  resolve(h, "ibv_free_device_list", "IBVERBS_1.1", &a.free_device_list, &missing);
  resolve(h, "ibv_get_device_name", "IBVERBS_1.1", &a.get_device_name, &missing);
  resolve(h, "ibv_open_device", "IBVERBS_1.1", &a.open_device, &missing);
  resolve(h, "ibv_close_device", "IBVERBS_1.1", &a.close_device, &missing);
  resolve(h, "ibv_query_device", "IBVERBS_1.1", &a.query_device, &missing);
  resolve(h, "ibv_query_port", "IBVERBS_1.1", &a.query_port_compat, &missing);
  resolve(h, "ibv_query_gid", "IBVERBS_1.1", &a.query_gid, &missing);
  if (!missing.empty()) {
    l.why = l.api.path + " has no " + missing + " (not libibverbs, or older than rdma-core's IBVERBS_1.1)";
    ::dlclose(h);
    return l;
  }
  a.file = file_of(h, a.path);
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
