// braid TCP transport: any two hosts, non-blocking sockets driven by the engine's
// Poller. See tcp_transport.cpp for the wire protocol.
#pragma once

#include "transport/transport.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace braid::transport {

/// Settings of one TCP transport instance (one per communicator).
struct TcpOptions : CommonOptions {
  /// Sockets opened per peer; large messages are striped across them.
  int sockets_per_peer = 1;
  /// Interface whose IPv4 address is bound and advertised (BRAID_SOCKET_IFNAME);
  /// empty = automatic (see select_address()).
  std::string ifname;
  /// Address of the bootstrap store, used by automatic selection as a hint.
  std::string master_addr;
  /// SO_SNDBUF/SO_RCVBUF in bytes; 0 leaves the OS default (autotuning).
  std::size_t socket_buffer = 0;
};

/// Creates the transport: binds a listening socket, registers it with `poller`, and
/// publishes its "ip:port" under key "tcp" in `directory`. Throws braid::Error
/// (Network) naming the interface/address when it cannot listen. `poller` and
/// `directory` must outlive the transport.
std::unique_ptr<Transport> make_tcp_transport(const TcpOptions& options, Poller& poller,
                                              PeerDirectory& directory);

/// The IPv4 address to bind and advertise: the address of `ifname` when given
/// (Error(InvalidUsage) listing the interfaces when it has none); otherwise 127.0.0.1
/// when `master_addr` is empty or a loopback address, else the address of the
/// interface whose subnet contains `master_addr`, else the first non-loopback up
/// interface, else 127.0.0.1. `prefer_external`: with no `ifname` and no `master_addr`,
/// the first non-loopback up interface rather than 127.0.0.1 (a unique id's store must
/// be reachable from other hosts).
std::string select_address(const std::string& ifname, const std::string& master_addr,
                           bool prefer_external = false);

}  // namespace braid::transport
