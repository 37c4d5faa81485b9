// The list of transports of this build. Registering a transport is one line here (an
// explicit list rather than static self-registration, which a static library's linker
// silently drops).
#include "transport/registry.hpp"

#include <braid/config.hpp>

namespace braid::transport {

const TransportEntry& tcp_entry();
#if BRAID_HAVE_SHM
const TransportEntry& shm_entry();
#endif
#if BRAID_HAVE_UCX
const TransportEntry& ucx_entry();
#endif
#if BRAID_HAVE_IBVERBS
const TransportEntry& ibverbs_entry();
#endif

const std::vector<const TransportEntry*>& registry() {
  static const std::vector<const TransportEntry*> all = {
      &tcp_entry(),
#if BRAID_HAVE_SHM
      &shm_entry(),
#endif
#if BRAID_HAVE_UCX
      &ucx_entry(),
#endif
#if BRAID_HAVE_IBVERBS
      &ibverbs_entry(),
#endif
  };
  return all;
}

const TransportEntry* find_transport(std::string_view name) {
  for (const TransportEntry* e : registry())
    if (name == e->name) return e;
  return nullptr;
}

std::string transport_names() {
  std::string out;
  for (const TransportEntry* e : registry()) {
    if (!out.empty()) out += ", ";
    out += e->name;
  }
  return out;
}

}  // namespace braid::transport
