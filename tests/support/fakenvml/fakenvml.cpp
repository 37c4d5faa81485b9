// fakenvml: a test-only stand-in for NVML (libnvidia-ml.so.1) with the entry points
// src/gpu/nvml.cpp loads, describing a host that the environment lays out, read at each
// nvmlInit_v2 (so one test process can describe several hosts):
//
//   FAKENVML_GPUS    NVML bus ids, comma-separated ("00000000:1B:00.0,00000000:43:00.0")
//   FAKENVML_LINKS   active NVLink links per GPU: one number for all, or one per GPU
//   FAKENVML_NVLINK  which pairs NVML calls NVLink peers: "all", "none" (default) or "0-1,2-3"
//   FAKENVML_INIT    what nvmlInit_v2 returns (default 0, success)
//   FAKENVML_NO_ACCESS  index of a GPU whose handle NVML refuses (NVML_ERROR_NO_PERMISSION)
//
// Handles are the GPU's index + 1 cast to a pointer. Not thread-safe (tests call it from one thread).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

struct PciInfo {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};

struct Host {
  std::vector<std::string> gpus;
  std::vector<int> links;
  std::set<std::pair<int, int>> nvlink;
  bool all = false;
  int no_access = -1;
};
Host g_host;
int g_inits = 0;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, sep))
    if (!part.empty()) out.push_back(part);
  return out;
}

void read_host() {
  Host h;
  h.gpus = split(env("FAKENVML_GPUS"), ',');
  const auto links = split(env("FAKENVML_LINKS"), ',');
  for (std::size_t i = 0; i < h.gpus.size(); ++i)
    h.links.push_back(links.empty() ? 0 : std::atoi(links[links.size() == 1 ? 0 : i].c_str()));
  const std::string nv = env("FAKENVML_NVLINK");
  h.all = nv == "all";
  if (!h.all && nv != "none")
    for (const auto& p : split(nv, ',')) {
      const auto ab = split(p, '-');
      if (ab.size() == 2) {
        int a = std::atoi(ab[0].c_str()), b = std::atoi(ab[1].c_str());
        h.nvlink.insert({a < b ? a : b, a < b ? b : a});
      }
    }
  h.no_access = env("FAKENVML_NO_ACCESS").empty() ? -1 : std::atoi(env("FAKENVML_NO_ACCESS").c_str());
  g_host = h;
}

int index_of(void* d) { return static_cast<int>(reinterpret_cast<std::uintptr_t>(d)) - 1; }
bool valid(void* d) { return index_of(d) >= 0 && index_of(d) < static_cast<int>(g_host.gpus.size()); }

constexpr int kSuccess = 0, kUninitialized = 1, kInvalidArgument = 2, kNoPermission = 4, kNotSupported = 3;

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int nvmlInit_v2() {
  const int rc = env("FAKENVML_INIT").empty() ? 0 : std::atoi(env("FAKENVML_INIT").c_str());
  if (rc != 0) return rc;
  read_host();
  ++g_inits;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlShutdown() {
  if (g_inits == 0) return kUninitialized;
  --g_inits;
  return kSuccess;
}

__attribute__((visibility("default"))) const char* nvmlErrorString(int r) {
  switch (r) {
    case kSuccess: return "Success";
    case kUninitialized: return "Uninitialized";
    case kInvalidArgument: return "Invalid Argument";
    case kNotSupported: return "Not Supported";
    case kNoPermission: return "Insufficient Permissions";
    case 9: return "Driver Not Loaded";
    default: return "Unknown Error";
  }
}

__attribute__((visibility("default"))) int nvmlDeviceGetCount_v2(unsigned int* n) {
  if (g_inits == 0) return kUninitialized;
  *n = static_cast<unsigned int>(g_host.gpus.size());
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void** d) {
  if (g_inits == 0) return kUninitialized;
  if (i >= g_host.gpus.size()) return kInvalidArgument;
  if (static_cast<int>(i) == g_host.no_access) return kNoPermission;
  *d = reinterpret_cast<void*>(static_cast<std::uintptr_t>(i) + 1);
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetPciInfo_v3(void* d, PciInfo* pci) {
  if (g_inits == 0) return kUninitialized;
  if (!valid(d)) return kInvalidArgument;
  std::memset(pci, 0, sizeof *pci);
  std::snprintf(pci->busId, sizeof pci->busId, "%s", g_host.gpus[static_cast<std::size_t>(index_of(d))].c_str());
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetNvLinkState(void* d, unsigned int link, int* active) {
  if (g_inits == 0) return kUninitialized;
  if (!valid(d) || link >= 18) return kInvalidArgument;
  const int n = g_host.links[static_cast<std::size_t>(index_of(d))];
  if (n == 0) return kNotSupported;
  *active = static_cast<int>(link) < n ? 1 : 0;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetP2PStatus(void* a, void* b, int caps, int* status) {
  if (g_inits == 0) return kUninitialized;
  if (!valid(a) || !valid(b) || caps != 2) return kInvalidArgument;
  int i = index_of(a), j = index_of(b);
  if (i > j) std::swap(i, j);
  *status = (g_host.all && i != j) || g_host.nvlink.count({i, j}) ? 0 : 5;  // OK or NOT_SUPPORTED
  return kSuccess;
}

}  // extern "C"
