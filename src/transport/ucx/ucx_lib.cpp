#include "transport/ucx/ucx_lib.hpp"

#include "base/dynlib.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>

namespace braid::transport::ucx {
namespace {

struct Loaded {
  Api api;
  std::string why;
  bool ok = false;
};

Loaded load_once(const std::string& library) {
  Loaded l;
  l.api.path = library.empty() ? "libucp.so.0" : library;
  void* h = base::open_library(
      l.api.path, "install UCX, e.g. Debian's libucx0, or point BRAID_UCX_LIBRARY at libucp.so", &l.why);
  if (h == nullptr) return l;
  Api& a = l.api;
  std::string missing;
  base::resolve(h, "ucp_get_version", &a.get_version, &missing);
  base::resolve(h, "ucp_config_read", &a.config_read, &missing);
  base::resolve(h, "ucp_config_release", &a.config_release, &missing);
  base::resolve(h, "ucp_config_modify", &a.config_modify, &missing);
  base::resolve(h, "ucp_init_version", &a.init_version, &missing);
  base::resolve(h, "ucp_cleanup", &a.cleanup, &missing);
  base::resolve(h, "ucp_context_query", &a.context_query, &missing);
  base::resolve(h, "ucp_context_print_info", &a.context_print_info, &missing);
  base::resolve(h, "ucp_worker_create", &a.worker_create, &missing);
  base::resolve(h, "ucp_worker_destroy", &a.worker_destroy, &missing);
  base::resolve(h, "ucp_worker_get_address", &a.worker_get_address, &missing);
  base::resolve(h, "ucp_worker_release_address", &a.worker_release_address, &missing);
  base::resolve(h, "ucp_worker_get_efd", &a.worker_get_efd, &missing);
  base::resolve(h, "ucp_worker_arm", &a.worker_arm, &missing);
  base::resolve(h, "ucp_worker_progress", &a.worker_progress, &missing);
  base::resolve(h, "ucp_ep_create", &a.ep_create, &missing);
  base::resolve(h, "ucp_ep_close_nbx", &a.ep_close_nbx, &missing);
  base::resolve(h, "ucp_tag_send_nbx", &a.tag_send_nbx, &missing);
  base::resolve(h, "ucp_tag_recv_nbx", &a.tag_recv_nbx, &missing);
  base::resolve(h, "ucp_request_check_status", &a.request_check_status, &missing);
  base::resolve(h, "ucp_request_cancel", &a.request_cancel, &missing);
  base::resolve(h, "ucp_request_free", &a.request_free, &missing);
  base::resolve(h, "ucs_status_string", &a.status_string, &missing);
  if (!missing.empty()) {
    l.why = l.api.path + " has no " + missing + " (UCX older than 1.10, or not libucp?)";
    ::dlclose(h);
    return l;
  }
  a.get_version(&a.major, &a.minor, &a.release);
  if (a.major < 1 || (a.major == 1 && a.minor < 10)) {
    l.why = l.api.path + " is UCX " + std::to_string(a.major) + "." + std::to_string(a.minor) +
            "; braid needs 1.10 or later (the nbx API)";
    ::dlclose(h);
    return l;
  }
  // The handle stays open for the life of the process: UCX registers atexit handlers and
  // keeps threads, so unloading it is never safe.
  l.ok = true;
  return l;
}

// "#      resource 1  :  md 1  dev 1  flags -- tcp/lo" -> "tcp/lo"
std::vector<std::string> parse_resources(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("resource") == std::string::npos) continue;
    const auto dash = line.rfind("-- ");
    if (dash == std::string::npos) continue;
    std::string r = line.substr(dash + 3);
    while (!r.empty() && (r.back() == ' ' || r.back() == '\r')) r.pop_back();
    if (!r.empty() && r.find('/') != std::string::npos) out.push_back(r);
  }
  return out;
}

}  // namespace

const Api* load(const std::string& library, std::string* why) {
  static std::once_flag once;
  static Loaded* loaded = nullptr;  // never freed: see load_once
  std::call_once(once, [&] { loaded = new Loaded(load_once(library)); });
  if (!loaded->ok) {
    if (why) *why = loaded->why;
    return nullptr;
  }
  return &loaded->api;
}

std::vector<std::string> context_resources(const Api& api, ucp_context_h context) {
  char* buf = nullptr;
  std::size_t len = 0;
  FILE* f = ::open_memstream(&buf, &len);
  if (f == nullptr) return {};
  api.context_print_info(context, f);
  std::fclose(f);
  auto out = parse_resources(std::string(buf, len));
  std::free(buf);
  return out;
}

bool is_rdma_transport(const std::string& tl) {
  for (const char* p : {"rc", "dc", "ud"}) {
    const std::string pre = p;
    if (tl == pre || tl.rfind(pre + "_", 0) == 0) return true;  // rc_verbs, rc_mlx5, dc_mlx5, ud_verbs...
  }
  return false;
}

std::string net_devices_for(const std::vector<std::string>& resources, const std::string& chosen) {
  std::vector<std::string> tcp, rdma;
  auto add = [](std::vector<std::string>& v, const std::string& d) {
    if (std::find(v.begin(), v.end(), d) == v.end()) v.push_back(d);
  };
  for (const auto& r : resources) {
    const auto slash = r.find('/');
    if (slash == std::string::npos) continue;
    const std::string tl = r.substr(0, slash), dev = r.substr(slash + 1);
    if (tl == "tcp") add(tcp, dev);
    if (is_rdma_transport(tl)) add(rdma, dev);
  }
  if (std::find(tcp.begin(), tcp.end(), chosen) == tcp.end() || tcp.size() == 1) return "";
  std::string out = chosen;
  for (const auto& d : rdma) out += "," + d;
  return out;
}

Status probe(const std::string& library) {
  Status s;
  const Api* a = load(library, &s.why);
  if (a == nullptr) return s;
  s.path = a->path;
  s.version = std::to_string(a->major) + "." + std::to_string(a->minor) + "." + std::to_string(a->release);
  ucp_config_t* config = nullptr;
  ucs_status_t st = a->config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) {
    s.why = std::string("ucp_config_read: ") + a->status_string(st) + " (check the UCX_* variables)";
    return s;
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG;
  ucp_context_h context = nullptr;
  st = a->init(&params, config, &context);
  a->config_release(config);
  if (st != UCS_OK) {
    s.why = std::string("ucp_init: ") + a->status_string(st) + " (check UCX_TLS and UCX_NET_DEVICES)";
    return s;
  }
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (a->context_query(context, &attr) == UCS_OK) s.memory_types = attr.memory_types;
  s.cuda = (s.memory_types & (std::uint64_t{1} << UCS_MEMORY_TYPE_CUDA)) != 0;
  s.resources = context_resources(*a, context);
  a->cleanup(context);
  for (const auto& r : s.resources)
    if (is_rdma_transport(r.substr(0, r.find('/')))) s.rdma = true;
  s.available = true;
  return s;
}

std::string describe(const Status& s) {
  if (!s.available) return "unavailable: " + s.why;
  // "tcp/lo", "tcp/eth0", "posix/memory" -> "tcp (lo, eth0), posix"
  std::vector<std::pair<std::string, std::vector<std::string>>> by_tl;
  for (const auto& r : s.resources) {
    const auto slash = r.find('/');
    const std::string tl = r.substr(0, slash), dev = r.substr(slash + 1);
    auto it = by_tl.begin();
    while (it != by_tl.end() && it->first != tl) ++it;
    if (it == by_tl.end()) it = by_tl.insert(by_tl.end(), {tl, {}});
    if (dev.rfind("memory", 0) != 0) it->second.push_back(dev);
  }
  std::ostringstream os;
  os << s.version << " (" << s.path << "): ";
  for (std::size_t i = 0; i < by_tl.size(); ++i) {
    os << (i ? ", " : "") << by_tl[i].first;
    const auto& devs = by_tl[i].second;
    if (!devs.empty()) {
      os << " (";
      for (std::size_t j = 0; j < devs.size(); ++j) os << (j ? ", " : "") << devs[j];
      os << ")";
    }
  }
  if (by_tl.empty()) os << "no transport resources";
  os << "; memory host" << (s.cuda ? ", cuda" : "") << "; RDMA " << (s.rdma ? "yes" : "none");
  return os.str();
}

}  // namespace braid::transport::ucx
