// Measuring the link between hosts (issue 35 item 3), for codec `auto` and braid_info.
//
// `auto` prices a compressed all-reduce against the slowest link's latency α and bandwidth
// B (compression/choose.hpp). Constants (tcp: 3 GB/s) said nothing of the job's real links,
// so the communicator measures them once, at the first call that needs them: rank 0 and
// the lowest rank on another host exchange
//   - 3 warm-up and 15 timed round trips of 8 bytes: α is half the median round trip;
//   - 3 messages of 4 MiB, each answered by 8 bytes: B = 4 MiB / (fastest - round trip).
// These are point-to-point messages of the communicator's own transports, tagged
// kLinkProbeTag; rank 0 then publishes the figures in the store and every other rank takes
// them from there, so that every rank prices with the same numbers and `auto` agrees. At
// 1 Gbit/s the probe takes about 0.1 s, once per communicator (children made after it
// inherit the figures).
#pragma once

#include "collectives/cost.hpp"
#include "compression/choose.hpp"
#include "core/comm_parts.hpp"

#include <chrono>
#include <cstdint>
#include <string>

namespace braid::core {

/// The tag of the probe's messages (a user's point-to-point tag is a uint32 too: this one
/// is documented as reserved in docs/codecs.md).
constexpr std::uint32_t kLinkProbeTag = 0xb4a1d0ffu;
/// The probe's large message.
constexpr std::size_t kLinkProbeBytes = std::size_t{4} << 20;

/// What a communicator measured.
struct LinkFigures {
  int a = -1, b = -1;           ///< the pair measured (-1: every rank on one host)
  compression::LinkModel link;  ///< α (seconds per message, one way) and bandwidth (bytes/s)
};

/// The rank the probe pairs with rank 0: the lowest rank on another host; -1 when every
/// rank is on rank 0's host.
int probe_partner(const collectives::Topology& topo);

/// The probe on rank 0 (`peer` = the partner) or on the partner (`peer` = 0), through
/// `poster`'s point-to-point calls; both must call it at the same point of their call
/// order. Throws what the calls throw (a failed or silent peer: the communicator's
/// errors, within `timeout`).
compression::LinkModel run_link_probe(Poster& poster, int rank, int peer);

/// The store's form of LinkFigures ("<a> <b> <alpha seconds> <bytes per second>", the two
/// reals in hexfloat), and its parser: the text is untrusted (another program may use the
/// store); false and why unless it is two ranks in [-1, world) and two positive finite
/// reals (a = -1 with zeros: one host).
std::string format_link_figures(const LinkFigures& f);
bool parse_link_figures(const std::string& text, int world, LinkFigures* out, std::string* why);

}  // namespace braid::core
