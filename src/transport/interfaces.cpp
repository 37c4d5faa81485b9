// Interface selection (interfaces.hpp): getifaddrs, the named interface, else the subnet of
// the store's address, else the first external interface, else loopback.
#include "transport/interfaces.hpp"

#include "base/text.hpp"

#include <braid/error.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <vector>

namespace braid::transport {

using base::errno_text;

namespace {

struct IfAddr {
  std::string name;
  in_addr addr{};
  in_addr mask{};
  unsigned flags = 0;
};

std::string ntop(in_addr a) {
  char ip[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a, ip, sizeof ip);
  return ip;
}

bool resolve_v4(const std::string& host, in_addr* out) {
  if (::inet_pton(AF_INET, host.c_str(), out) == 1) return true;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return false;
  *out = reinterpret_cast<const sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return true;
}

bool is_loopback(in_addr a) { return (ntohl(a.s_addr) >> 24) == 127; }

/// The loopback interface (the one holding 127.0.0.1; "lo" where none is listed).
Interface loopback(const std::vector<IfAddr>& list) {
  for (const IfAddr& e : list)
    if (ntohl(e.addr.s_addr) == INADDR_LOOPBACK) return {e.name, "127.0.0.1"};
  return {"lo", "127.0.0.1"};
}

}  // namespace

Interface select_interface(const std::string& ifname, const std::string& master_addr, bool prefer_external) {
  std::vector<IfAddr> list;
  ifaddrs* ifa = nullptr;
  if (::getifaddrs(&ifa) == 0) {
    for (ifaddrs* p = ifa; p != nullptr; p = p->ifa_next) {
      if (p->ifa_addr == nullptr || p->ifa_addr->sa_family != AF_INET) continue;
      IfAddr e;
      e.name = p->ifa_name;
      e.addr = reinterpret_cast<const sockaddr_in*>(p->ifa_addr)->sin_addr;
      if (p->ifa_netmask != nullptr) e.mask = reinterpret_cast<const sockaddr_in*>(p->ifa_netmask)->sin_addr;
      e.flags = p->ifa_flags;
      list.push_back(e);
    }
    ::freeifaddrs(ifa);
  } else if (!ifname.empty()) {
    throw Error(ErrorCode::System, std::string("getifaddrs: ") + errno_text(errno));
  }

  if (!ifname.empty()) {
    for (const IfAddr& e : list) {
      if (e.name == ifname) return {e.name, ntop(e.addr)};
    }
    std::string known;
    for (const IfAddr& e : list) known += (known.empty() ? "" : ", ") + e.name + " (" + ntop(e.addr) + ")";
    throw Error(ErrorCode::InvalidUsage, "network interface '" + ifname +
                                             "' (BRAID_SOCKET_IFNAME) has no IPv4 address; interfaces with one: " +
                                             (known.empty() ? "none" : known));
  }
  if ((master_addr.empty() && !prefer_external) || master_addr == "localhost" || master_addr == "::1")
    return loopback(list);
  in_addr master{};
  if (resolve_v4(master_addr, &master)) {
    if (is_loopback(master)) return loopback(list);
    for (const IfAddr& e : list) {
      if ((e.flags & IFF_UP) && !(e.flags & IFF_LOOPBACK) && e.mask.s_addr != 0 &&
          (e.addr.s_addr & e.mask.s_addr) == (master.s_addr & e.mask.s_addr)) {
        return {e.name, ntop(e.addr)};
      }
    }
  }
  for (const IfAddr& e : list) {
    if ((e.flags & IFF_UP) && !(e.flags & IFF_LOOPBACK) && !is_loopback(e.addr)) return {e.name, ntop(e.addr)};
  }
  return loopback(list);
}

std::string select_address(const std::string& ifname, const std::string& master_addr, bool prefer_external) {
  return select_interface(ifname, master_addr, prefer_external).address;
}

}  // namespace braid::transport
