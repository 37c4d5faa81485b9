#include "core/link_probe.hpp"

#include "base/text.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <vector>

namespace braid::core {

int probe_partner(const collectives::Topology& topo) {
  const int world = static_cast<int>(topo.host_of.size());
  for (int r = 1; r < world; ++r)
    if (topo.host_of[static_cast<std::size_t>(r)] != topo.host_of[0]) return r;
  return -1;
}

compression::LinkModel run_link_probe(Poster& poster, int rank, int peer) {
  using Clock = std::chrono::steady_clock;
  const bool leads = rank == 0;
  std::vector<unsigned char> small(8, 0), large(kLinkProbeBytes, 0);
  // One exchange: the leader sends `bytes` and waits for 8 back; the partner the reverse.
  auto exchange = [&](unsigned char* data, std::size_t bytes) {
    if (leads) {
      Work s = poster.post_p2p(true, data, bytes, peer, kLinkProbeTag);
      Work r = poster.post_p2p(false, small.data(), small.size(), peer, kLinkProbeTag);
      s.wait();
      r.wait();
    } else {
      poster.post_p2p(false, data, bytes, peer, kLinkProbeTag).wait();
      poster.post_p2p(true, small.data(), small.size(), peer, kLinkProbeTag).wait();
    }
  };
  constexpr int kWarm = 3, kTimed = 15, kLarge = 3;
  std::vector<double> rtt;
  for (int i = 0; i < kWarm + kTimed; ++i) {
    const auto t0 = Clock::now();
    exchange(small.data(), small.size());
    if (i >= kWarm) rtt.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  double best = 0;
  for (int i = 0; i < kLarge; ++i) {
    const auto t0 = Clock::now();
    exchange(large.data(), large.size());
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    best = i == 0 ? t : std::min(best, t);
  }
  std::nth_element(rtt.begin(), rtt.begin() + kTimed / 2, rtt.end());
  const double round_trip = rtt[kTimed / 2];
  // The large exchange is the message one way plus a small one back (one round trip of
  // latency); what is left is the bandwidth's. A link so fast that the difference vanishes
  // in the noise is priced by the whole exchange instead.
  const double wire = best - round_trip > 0.1 * best ? best - round_trip : best;
  compression::LinkModel m;
  m.alpha_s = round_trip / 2;
  m.Bps = static_cast<double>(kLinkProbeBytes) / wire;
  return m;
}

std::string format_link_figures(const LinkFigures& f) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "%d %d %a %a", f.a, f.b, f.link.alpha_s, f.link.Bps);
  return buf;
}

bool parse_link_figures(const std::string& text, int world, LinkFigures* out, std::string* why) {
  std::istringstream in(text);
  std::string a, b, alpha, bps, extra;
  if (!(in >> a >> b >> alpha >> bps) || (in >> extra)) {
    *why = "expected '<rank> <rank> <latency> <bandwidth>', got " + std::to_string(text.size()) + " bytes";
    return false;
  }
  std::int64_t ra = 0, rb = 0;
  if (!base::parse_int64(a, &ra) || !base::parse_int64(b, &rb) || ra < -1 || rb < -1 || ra >= world || rb >= world) {
    *why = "the ranks are not in [-1, " + std::to_string(world) + ")";
    return false;
  }
  double al = 0, bw = 0;
  const bool read = base::parse_double(alpha, &al) && base::parse_double(bps, &bw);
  const bool one_host = ra == -1 && rb == -1 && al == 0 && bw == 0;
  if (!read || !std::isfinite(al) || !std::isfinite(bw) || (!one_host && (!(al > 0) || !(bw > 0)))) {
    *why = "the latency and bandwidth are not positive finite numbers";
    return false;
  }
  out->a = static_cast<int>(ra);
  out->b = static_cast<int>(rb);
  out->link.alpha_s = al;
  out->link.Bps = bw;
  return true;
}

}  // namespace braid::core
