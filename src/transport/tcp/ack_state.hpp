// What the kernel knows about a TCP connection's acknowledgements (TCP_INFO), for the tcp
// transport's dead-peer detection. Kept apart from tcp_transport.cpp because the kernel's
// struct tcp_info (linux/tcp.h, which has the peer's window) clashes with glibc's older
// one (netinet/tcp.h).
#pragma once

#include <cstdint>

namespace braid::transport::tcp {

struct AckState {
  std::uint32_t ms_since_ack = 0;  ///< since the last ACK from the peer (any ACK: data, probe, keepalive)
  bool in_flight = false;          ///< bytes sent and unacknowledged, or probes unanswered
  bool window_open = true;         ///< the peer's last advertised receive window was not zero
};

/// Reads `fd`'s TCP_INFO. False when the kernel does not say (then nothing is known): the
/// peer's window needs Linux 5.4 or later.
bool read_ack_state(int fd, AckState* out);

}  // namespace braid::transport::tcp
