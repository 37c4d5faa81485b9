// Which network interface a rank uses to reach its peers: one choice, shared by the tcp
// transport (the address it binds and advertises), the ucx transport (the only interface
// UCX may use for tcp) and the bootstrap (the address a unique id's store listens on).
#pragma once

#include <string>

namespace braid::transport {

/// An interface and its IPv4 address ("eth0", "10.0.0.5").
struct Interface {
  std::string name;
  std::string address;
};

/// The interface to use: `ifname` when given (Error(InvalidUsage) listing the interfaces
/// when it has no IPv4 address); otherwise loopback when `master_addr` is empty or a
/// loopback address, else the interface whose subnet contains `master_addr`, else the first
/// non-loopback up interface, else loopback. `prefer_external`: with no `ifname` and no
/// `master_addr`, the first non-loopback up interface rather than loopback (a unique id's
/// store must be reachable from other hosts).
Interface select_interface(const std::string& ifname, const std::string& master_addr,
                           bool prefer_external = false);

/// select_interface(...).address.
std::string select_address(const std::string& ifname, const std::string& master_addr,
                           bool prefer_external = false);

}  // namespace braid::transport
