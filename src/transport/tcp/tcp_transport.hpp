// braid TCP transport: any two hosts, non-blocking sockets driven by the engine's
// Poller. See tcp_transport.cpp for the wire protocol.
#pragma once

#include "transport/interfaces.hpp"
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
  /// empty = automatic (select_interface(), transport/interfaces.hpp).
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

}  // namespace braid::transport
