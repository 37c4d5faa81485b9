// The TCP transport's registry entry: its configuration rows and how the engine makes it.
#include "transport/registry.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace braid::transport {

namespace {

std::unique_ptr<Transport> make(const TransportContext& c) {
  auto t = options_for<TcpOptions>(c);
  t.sockets_per_peer = static_cast<int>(c.settings->integer("BRAID_SOCKETS_PER_PEER").value_or(1));
  t.ifname = c.settings->text("BRAID_SOCKET_IFNAME");
  t.master_addr = c.master_addr;
  t.socket_buffer = c.settings->bytes("BRAID_SOCKET_BUFFER");
  return make_tcp_transport(t, *c.poller, *c.directory);
}

// Any pair, on any host; below shared memory inside a host.
int preference(const PairFacts&) { return 10; }

}  // namespace

const TransportEntry& tcp_entry() {
  using base::SettingType;
  static const TransportEntry entry{
      "tcp",
      "TCP sockets between any hosts",
      "tcp",
      {
          {"BRAID_SOCKET_IFNAME", SettingType::text, "",
           "Network interface whose IPv4 address TCP binds and advertises (default: chosen from the "
           "master address)."},
          {"BRAID_SOCKETS_PER_PEER", SettingType::integer, "2",
           "TCP sockets per peer; large messages are striped across them.", true, 1, 64},
          {"BRAID_SOCKET_BUFFER", SettingType::bytes, "0", "SO_SNDBUF/SO_RCVBUF of TCP sockets (0: OS autotuning)."},
      },
      &preference,
      &make,
  };
  return entry;
}

}  // namespace braid::transport
