#include "transport/tcp/ack_state.hpp"

#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>

namespace braid::transport::tcp {

bool read_ack_state(int fd, AckState* out) {
  struct tcp_info ti {};
  socklen_t len = sizeof ti;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return false;
  if (len < offsetof(struct tcp_info, tcpi_snd_wnd) + sizeof ti.tcpi_snd_wnd) return false;
  out->ms_since_ack = ti.tcpi_last_ack_recv;
  // Sent and unacknowledged (or probes unanswered). Not bytes queued and not yet sent: a
  // sender holds those back while the receiver's window is smaller than a segment, and the
  // receiver then has nothing to acknowledge, so they would make a live peer that reads
  // slowly look dead (seen: a rank waiting on a stopped rank was declared unreachable by its
  // upstream neighbour after 1 s, under load).
  out->in_flight = ti.tcpi_unacked > 0 || ti.tcpi_probes > 0;
  out->window_open = ti.tcpi_snd_wnd > 0;
  return true;
}

}  // namespace braid::transport::tcp
