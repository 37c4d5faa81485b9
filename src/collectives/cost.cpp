// The cost model: a discrete-event simulation of all ranks' plans (see cost.hpp for
// the timing rules), closed-form α-β-γ formulas, and least-squares calibration.
//
// The simulation compiles the plans of all ranks into flat arrays (one entry per step
// of any rank: kind, peer, bytes, dependencies left, next step of the same queue, the
// matching receive of a send, reverse dependencies) and then processes events in time
// order. Ports and compute are reserved when a step is posted or becomes ready, in
// time order, so transfers sharing a port serialize first come first served. Events
// at the current time go through a FIFO (most of a plan's steps start "now": receives
// landing on posted steps, chains of posted queue entries), future ones into one
// bucket per distinct time under a heap of times.
#include "collectives/cost.hpp"

#include "collectives/algorithms.hpp"
#include "compression/framed.hpp"

#include "base/text.hpp"

#include <braid/error.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <queue>
#include <sstream>
#include <unordered_map>

namespace braid::collectives {

const char* to_string(LinkClass c) noexcept {
  switch (c) {
    case LinkClass::shm: return "shm";
    case LinkClass::tcp: return "tcp";
    case LinkClass::nvlink: return "nvlink";
    case LinkClass::ib: return "ib";
    case LinkClass::pcie: return "pcie";
  }
  return "?";
}

CostModel CostModel::defaults() {
  CostModel m;
  // Development machine (docs/cost-model.md): shared memory ~9 GB/s per direction and
  // ~2 us per message; TCP loopback ~3 GB/s per direction per pair and ~25 us per
  // message (42.7 us for a 2-rank 4 KiB ring all-reduce = 2 hops).
  // Shared memory is eager (8 ring slots per pair); TCP is rendezvous in the engine.
  m[LinkClass::shm] = {2e-6, 1.0 / 9e9, true};
  m[LinkClass::tcp] = {25e-6, 1.0 / 3e9, false};
  // H100 SXM, NVLink4 through NVSwitch: 450 GB/s per GPU per direction on the wire, of
  // which a copy achieves ~390 (nvbandwidth's copy-engine peer copies on DGX H100;
  // packet headers and flow control take the rest); ~1.5 us. The achieved rate, because
  // that is what a ring moves: priced at 450, 8 ranks predicted 450 GB/s of busbw where
  // nccl-tests publishes ~370 (docs/cost-model.md, "Predictions").
  m[LinkClass::nvlink] = {1.5e-6, 1.0 / 390e9, false};
  // PCIe Gen5 x16 peer-to-peer (GPUs without NVLink, e.g. H100 PCIe): 64 GB/s line rate,
  // ~55 GB/s measured host to device by nvbandwidth; 50 GB/s between peers through a
  // switch; ~2.5 us.
  m[LinkClass::pcie] = {2.5e-6, 1.0 / 50e9, false};
  // NDR InfiniBand 400 Gb/s = 50 GB/s per direction, ~5 us end to end.
  m[LinkClass::ib] = {5e-6, 1.0 / 50e9, false};
  // c = a + b on one core: 9.25 GB/s of output; memcpy 15.5 GB/s.
  m.gamma = 1.0 / 9.25e9;
  m.copy_beta = 1.0 / 15.5e9;
  return m;
}

std::string serialize(const CostModel& model) {
  std::ostringstream os;
  char buf[64];
  auto put = [&](double v) {
    std::snprintf(buf, sizeof buf, "%a", v);
    os << buf;
  };
  os << "v1";
  for (int c = 0; c < kNumLinkClasses; ++c) {
    os << ";" << to_string(static_cast<LinkClass>(c)) << "=";
    put(model.link[static_cast<std::size_t>(c)].alpha);
    os << ",";
    put(model.link[static_cast<std::size_t>(c)].beta);
    os << (model.link[static_cast<std::size_t>(c)].eager ? ",eager" : ",rendezvous");
  }
  os << ";gamma=";
  put(model.gamma);
  os << ";copy=";
  put(model.copy_beta);
  return os.str();
}

CostModel deserialize(std::string_view text) {
  // Surrounding white space (a file's final newline) is not part of the model.
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  const std::string s(text);
  auto bad = [&](const std::string& why) {
    return Error(ErrorCode::InvalidUsage, "malformed cost model '" + s + "': " + why);
  };
  const std::vector<std::string> fields = base::split(s, ';');
  if (fields.empty() || fields[0] != "v1") throw bad("expected version v1 first");
  auto number = [&](const std::string& v) {
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || !std::isfinite(d) || d < 0) throw bad("bad number '" + v + "'");
    return d;
  };
  // Text from before a link class existed lacks it: that class keeps its default.
  CostModel m = CostModel::defaults();
  constexpr int kFirstLinkClasses = 4;  // shm, tcp, nvlink, ib: always written
  std::vector<bool> seen(kNumLinkClasses + 2, false);  // link classes, gamma, copy
  auto mark = [&](int k, const std::string& key) {
    if (seen[static_cast<std::size_t>(k)]) throw bad("field '" + key + "' given twice");
    seen[static_cast<std::size_t>(k)] = true;
  };
  for (std::size_t i = 1; i < fields.size(); ++i) {
    const auto eq = fields[i].find('=');
    if (eq == std::string::npos) throw bad("field without '='");
    const std::string key = fields[i].substr(0, eq), val = fields[i].substr(eq + 1);
    bool known = false;
    for (int c = 0; c < kNumLinkClasses; ++c) {
      if (key != to_string(static_cast<LinkClass>(c))) continue;
      const auto c1 = val.find(',');
      const auto c2 = c1 == std::string::npos ? c1 : val.find(',', c1 + 1);
      if (c2 == std::string::npos) throw bad("link '" + key + "' needs alpha,beta,eager|rendezvous");
      const std::string proto = val.substr(c2 + 1);
      if (proto != "eager" && proto != "rendezvous") throw bad("link '" + key + "': eager or rendezvous");
      m.link[static_cast<std::size_t>(c)] = {number(val.substr(0, c1)), number(val.substr(c1 + 1, c2 - c1 - 1)),
                                             proto == "eager"};
      mark(c, key);
      known = true;
    }
    if (key == "gamma") m.gamma = number(val), mark(kNumLinkClasses, key), known = true;
    if (key == "copy") m.copy_beta = number(val), mark(kNumLinkClasses + 1, key), known = true;
    if (!known) throw bad("unknown field '" + key + "'");
  }
  for (int k = 0; k < kNumLinkClasses + 2; ++k) {
    if (seen[static_cast<std::size_t>(k)] || (k >= kFirstLinkClasses && k < kNumLinkClasses)) continue;
    throw bad(std::string("missing field '") +
              (k < kNumLinkClasses ? to_string(static_cast<LinkClass>(k)) : k == kNumLinkClasses ? "gamma" : "copy") +
              "' (every model has shm, tcp, nvlink, ib, gamma and copy)");
  }
  return m;
}

Topology Topology::single_host(int world, LinkClass intra) {
  Topology t;
  t.host_of.assign(static_cast<std::size_t>(std::max(world, 0)), 0);
  t.intra = intra;
  t.inter = intra;
  return t;
}

Topology Topology::hosts(int world, int ranks_per_host, LinkClass intra, LinkClass inter, double nic_bytes_per_s) {
  if (ranks_per_host < 1) throw Error(ErrorCode::InvalidUsage, "Topology::hosts: ranks_per_host must be >= 1");
  Topology t;
  t.host_of.resize(static_cast<std::size_t>(std::max(world, 0)));
  for (int r = 0; r < world; ++r) t.host_of[static_cast<std::size_t>(r)] = r / ranks_per_host;
  t.intra = intra;
  t.inter = inter;
  t.nic_bytes_per_s = nic_bytes_per_s;
  return t;
}

int Topology::num_hosts() const {
  if (host_of.empty()) return 1;
  std::vector<int> h = host_of;
  std::sort(h.begin(), h.end());
  return static_cast<int>(std::unique(h.begin(), h.end()) - h.begin());
}

namespace {

// Bytes of a region on the wire: elements of the call's type, or a framed payload
// (compression/framed.hpp) for the packed buffer of a compressed plan.
std::uint64_t region_bytes(const Plan& plan, const Region& r, std::size_t elem_size) {
  if (r.buf != Buffer::packed) return r.count * elem_size;
  return compression::framed_bytes(plan.request.codec, plan.packed_frame, r.count);
}

constexpr std::uint32_t kNone = 0xffffffffu;

enum : std::uint8_t { kPrevPosted = 1, kPosted = 2, kArrived = 4, kDone = 8, kWaiting = 16 };

// An event: step g (low 31 bits) is done (type bit clear) or its message has landed
// (type bit set), at time t.
constexpr std::uint32_t kArriveBit = 0x80000000u;
struct Event {
  double t;
  std::uint32_t g_type;
  std::int32_t rank;
};

// One step of one rank, as the simulation needs it (32 bytes: one cache line holds two).
struct SimStep {
  std::uint64_t bytes = 0;
  std::uint32_t deps_left = 0;
  std::uint32_t qnext = kNone;       // next step of the same queue
  std::uint32_t match = kNone;       // send: the receive it lands in; receive: its send
  std::uint32_t rdep_begin = 0;      // reverse dependencies: rdeps[rdep_begin, next step's rdep_begin)
  std::int32_t peer = -1;
  std::uint8_t kind = 0;
  std::uint8_t flags = 0;
};

struct Sim {
  // Model.
  std::vector<int> host;
  LinkCost intra{}, inter{};
  bool intra_is_inter_port = false;  // one link class for both: one port per rank
  double nic_beta = 0;
  double gamma = 0, copy_beta = 0;

  // Steps of all ranks, rank r's plan at [rank_begin[r], rank_begin[r+1]); one extra
  // sentinel step at the end closes the last rdep range.
  std::vector<std::uint32_t> rank_begin;
  std::vector<SimStep> st;
  std::vector<std::uint32_t> rdeps;
  // Queue heads per rank and peer (peers sorted as Plan::peers), for matching.
  std::vector<std::vector<int>> peers;
  std::vector<std::vector<std::uint32_t>> head_send, head_recv;
  std::uint64_t messages = 0;
  double wire_bytes = 0;

  // Resources: free-at times.
  std::vector<double> out_free, in_free;  // [rank * 2 + (inter port ? 1 : 0)]
  std::vector<double> nic_out, nic_in;    // per host
  std::vector<double> comp_free;          // per rank

  // Event processing.
  double now = 0, makespan = 0;
  std::uint64_t done = 0;
  std::vector<Event> fifo;  // events due now
  std::size_t fifo_head = 0;
  // Future events, grouped by time: a heap of distinct times and one bucket of events
  // per time, handled in the order they were scheduled. Plans are symmetric enough
  // that many events share a time (every rank of a ring finishes a step at once), so
  // this takes far fewer heap operations than a heap of events.
  std::priority_queue<double, std::vector<double>, std::greater<double>> times;
  std::unordered_map<double, std::uint32_t> bucket_of;
  std::vector<std::vector<Event>> buckets;
  std::vector<std::uint32_t> free_buckets;

  std::uint64_t num_steps() const { return st.empty() ? 0 : st.size() - 1; }

  void schedule(double t, std::uint32_t g_type, std::int32_t rank) {
    const Event e{t, g_type, rank};
    if (t <= now) {
      fifo.push_back(e);
      return;
    }
    const auto [it, fresh] = bucket_of.try_emplace(t, 0u);
    if (fresh) {
      if (free_buckets.empty()) {
        it->second = static_cast<std::uint32_t>(buckets.size());
        buckets.emplace_back();
      } else {
        it->second = free_buckets.back();
        free_buckets.pop_back();
      }
      times.push(t);
    }
    buckets[it->second].push_back(e);
  }

  void add_rank(int r, const Plan& plan) {
    const auto base = static_cast<std::uint32_t>(st.size());
    const std::size_t n = plan.steps.size();
    if (base + n >= kArriveBit - 1) throw Error(ErrorCode::InvalidUsage, "simulation too large (over 2 billion steps)");
    const std::size_t es = plan.request.elem_size;
    peers[static_cast<std::size_t>(r)] = plan.peers;
    auto& hs = head_send[static_cast<std::size_t>(r)];
    auto& hr = head_recv[static_cast<std::size_t>(r)];
    hs.assign(plan.peers.size(), kNone);
    hr.assign(plan.peers.size(), kNone);
    std::vector<std::uint32_t> last_send(plan.peers.size(), kNone), last_recv(plan.peers.size(), kNone);
    std::uint32_t last_local = kNone;
    // Reverse dependencies, local CSR appended to the global one.
    std::vector<std::uint32_t> rcount(n + 1, 0);
    for (std::size_t i = 0; i < n; ++i) {
      const Step& s = plan.steps[i];
      for (std::uint32_t d = 0; d < s.dep_count; ++d) {
        const std::uint32_t dep = plan.deps[s.dep_begin + d];
        if (dep >= i)
          throw Error(ErrorCode::InvalidUsage, "rank " + std::to_string(r) + " step " + std::to_string(i) +
                                                   " depends on a later step");
        ++rcount[dep + 1];
      }
    }
    for (std::size_t i = 0; i < n; ++i) rcount[i + 1] += rcount[i];
    const auto rbase = static_cast<std::uint32_t>(rdeps.size());
    rdeps.resize(rdeps.size() + rcount[n]);
    std::vector<std::uint32_t> fill(rcount.begin(), rcount.end() - 1);
    for (std::size_t i = 0; i < n; ++i) {
      const Step& s = plan.steps[i];
      const auto g = static_cast<std::uint32_t>(base + i);
      for (std::uint32_t d = 0; d < s.dep_count; ++d) {
        const std::uint32_t dep = plan.deps[s.dep_begin + d];
        rdeps[rbase + fill[dep]++] = g;
      }
      SimStep x;
      x.kind = static_cast<std::uint8_t>(s.kind);
      x.peer = s.peer;
      x.bytes = region_bytes(plan, s.kind == StepKind::send ? s.src : s.dst, es);
      // Codec passes are priced per f32 byte of their values, at γ.
      if (s.kind == StepKind::encode) x.bytes = s.src.count * 4;
      if (s.kind == StepKind::decode || s.kind == StepKind::decode_add) x.bytes = s.dst.count * 4;
      x.deps_left = s.dep_count;
      x.rdep_begin = rbase + rcount[i];
      std::uint32_t* last = &last_local;
      std::uint32_t* head = nullptr;
      if (s.kind == StepKind::send || s.kind == StepKind::recv || s.kind == StepKind::recv_reduce) {
        const auto it = std::lower_bound(plan.peers.begin(), plan.peers.end(), s.peer);
        if (it == plan.peers.end() || *it != s.peer || s.peer == r)
          throw Error(ErrorCode::InvalidUsage,
                      "rank " + std::to_string(r) + " step " + std::to_string(i) + " has an invalid peer");
        const auto pi = static_cast<std::size_t>(it - plan.peers.begin());
        if (s.kind == StepKind::send) last = &last_send[pi], head = &hs[pi];
        else last = &last_recv[pi], head = &hr[pi];
      }
      if (*last == kNone) {
        x.flags |= kPrevPosted;
        if (head) *head = g;
      } else {
        st[*last].qnext = g;
      }
      *last = g;
      st.push_back(x);
    }
    rank_begin.push_back(static_cast<std::uint32_t>(st.size()));
  }

  // Pairs the n-th send from a to b with the n-th receive b posts for a.
  void match_messages() {
    const int world = static_cast<int>(peers.size());
    for (int a = 0; a < world; ++a) {
      const auto& pa = peers[static_cast<std::size_t>(a)];
      for (std::size_t i = 0; i < pa.size(); ++i) {
        const int b = pa[i];
        if (b < 0 || b >= world)
          throw Error(ErrorCode::InvalidUsage,
                      "rank " + std::to_string(a) + " names peer " + std::to_string(b) + " outside the world");
        const auto& pb = peers[static_cast<std::size_t>(b)];
        const auto it = std::lower_bound(pb.begin(), pb.end(), a);
        std::uint32_t q = (it != pb.end() && *it == a)
                              ? head_recv[static_cast<std::size_t>(b)][static_cast<std::size_t>(it - pb.begin())]
                              : kNone;
        std::uint32_t s = head_send[static_cast<std::size_t>(a)][i];
        while (s != kNone && q != kNone) {
          if (st[s].bytes != st[q].bytes)
            throw Error(ErrorCode::InvalidUsage, "rank " + std::to_string(a) + " sends " +
                                                     std::to_string(st[s].bytes) + " bytes to rank " +
                                                     std::to_string(b) + " which expects " + std::to_string(st[q].bytes));
          st[s].match = q;
          st[q].match = s;
          ++messages;
          wire_bytes += static_cast<double>(st[s].bytes);
          s = st[s].qnext;
          q = st[q].qnext;
        }
        if (s != kNone)
          throw Error(ErrorCode::InvalidUsage, "rank " + std::to_string(a) + " sends more messages to rank " +
                                                   std::to_string(b) + " than it receives");
        if (q != kNone)
          throw Error(ErrorCode::InvalidUsage, "rank " + std::to_string(b) + " waits for more messages from rank " +
                                                   std::to_string(a) + " than it sends");
      }
    }
    peers.clear();
    head_send.clear();
    head_recv.clear();
  }

  double reserve_compute(std::int32_t r, double t, double seconds) {
    double& f = comp_free[static_cast<std::size_t>(r)];
    f = std::max(t, f) + seconds;
    return f;
  }

  const LinkCost& link(std::int32_t a, std::int32_t b) const {
    return host[static_cast<std::size_t>(a)] != host[static_cast<std::size_t>(b)] ? inter : intra;
  }

  // Moves send g of rank r from time t: the message passes through the sender's port,
  // the two hosts' NICs when they are shared, and the receiver's port. Each is a FIFO
  // server busy for bytes·(its β) from when the message reaches it and it is free; the
  // message leaves a stage no earlier than it left the previous one (cut-through, as
  // through a switch with buffers). The send is done when the message has left this
  // host; it lands α after leaving the last stage.
  void transmit(std::uint32_t g, std::int32_t r, double t) {
    const SimStep& x = st[g];
    const std::int32_t p = x.peer;
    const int hr = host[static_cast<std::size_t>(r)], hp = host[static_cast<std::size_t>(p)];
    const bool cross = hr != hp;
    const LinkCost& lc = cross ? inter : intra;
    const std::size_t slot = (cross && !intra_is_inter_port) ? 1 : 0;
    const double b = static_cast<double>(x.bytes);
    double start = t, end = t;
    auto stage = [&](double& free, double beta) {
      start = std::max(start, free);
      free = start + b * beta;
      end = std::max(end, free);
    };
    stage(out_free[static_cast<std::size_t>(r) * 2 + slot], lc.beta);
    const bool nic = cross && nic_beta > 0;
    if (nic) stage(nic_out[static_cast<std::size_t>(hr)], nic_beta);
    schedule(end, g, r);
    if (nic) stage(nic_in[static_cast<std::size_t>(hp)], nic_beta);
    stage(in_free[static_cast<std::size_t>(p) * 2 + slot], lc.beta);
    schedule(end + lc.alpha, x.match | kArriveBit, p);
  }

  void start_step(std::uint32_t g, std::int32_t r, double t) {
    SimStep& x = st[g];
    switch (static_cast<StepKind>(x.kind)) {
      case StepKind::send:
        if (link(r, x.peer).eager || (st[x.match].flags & kPosted)) transmit(g, r, t);
        else x.flags |= kWaiting;  // rendezvous: until the receive is posted
        break;
      case StepKind::recv:
      case StepKind::recv_reduce:
        if (x.flags & kArrived) {
          ready(g, r, t);
        } else if (st[x.match].flags & kWaiting) {  // its send waited for this receive
          st[x.match].flags &= static_cast<std::uint8_t>(~kWaiting);
          transmit(x.match, x.peer, t);
        }
        break;
      case StepKind::copy:
      case StepKind::scale:  // one read, one write, like a copy
        schedule(reserve_compute(r, t, static_cast<double>(x.bytes) * copy_beta), g, r);
        break;
      case StepKind::reduce:
      case StepKind::encode:
      case StepKind::decode:
      case StepKind::decode_add:
        schedule(reserve_compute(r, t, static_cast<double>(x.bytes) * gamma), g, r);
        break;
    }
  }

  // A receive that is posted and whose message has landed.
  void ready(std::uint32_t g, std::int32_t r, double t) {
    const SimStep& x = st[g];
    if (static_cast<StepKind>(x.kind) == StepKind::recv) schedule(t, g, r);
    else schedule(reserve_compute(r, t, static_cast<double>(x.bytes) * gamma), g, r);
  }

  // Posts g (dependencies done, at the head of its queue) and then every following
  // step of the same queue whose dependencies are done too.
  void post(std::uint32_t g, std::int32_t r, double t) {
    for (;;) {
      st[g].flags |= kPosted;
      start_step(g, r, t);
      const std::uint32_t n = st[g].qnext;
      if (n == kNone) return;
      st[n].flags |= kPrevPosted;
      if (st[n].deps_left != 0) return;
      g = n;
    }
  }

  void handle(const Event& e) {
    const std::uint32_t g = e.g_type & ~kArriveBit;
    SimStep& x = st[g];
    if (e.g_type & kArriveBit) {
      x.flags |= kArrived;
      if (x.flags & kPosted) ready(g, e.rank, e.t);
      return;
    }
    x.flags |= kDone;
    ++done;
    makespan = std::max(makespan, e.t);
    const std::uint32_t end = st[g + 1].rdep_begin;
    for (std::uint32_t k = x.rdep_begin; k < end; ++k) {
      SimStep& d = st[rdeps[k]];
      if (--d.deps_left == 0 && (d.flags & kPrevPosted) && !(d.flags & kPosted)) post(rdeps[k], e.rank, e.t);
    }
  }

  void run() {
    const auto world = rank_begin.size() - 1;
    for (std::size_t r = 0; r < world; ++r)
      for (std::uint32_t g = rank_begin[r]; g < rank_begin[r + 1]; ++g)
        if (st[g].deps_left == 0 && (st[g].flags & kPrevPosted) && !(st[g].flags & kPosted))
          post(g, static_cast<std::int32_t>(r), 0.0);
    auto drain = [this] {
      while (fifo_head < fifo.size()) {
        const Event e = fifo[fifo_head++];
        handle(e);
      }
      fifo.clear();
      fifo_head = 0;
    };
    std::vector<Event> cur;
    for (;;) {
      drain();
      if (times.empty()) break;
      now = times.top();
      times.pop();
      const auto it = bucket_of.find(now);
      const std::uint32_t b = it->second;
      bucket_of.erase(it);
      cur.swap(buckets[b]);  // handling may add buckets: do not hold a reference
      for (const Event& e : cur) {
        handle(e);
        drain();
      }
      cur.clear();
      buckets[b].swap(cur);
      free_buckets.push_back(b);
    }
    if (done != num_steps()) {
      for (std::size_t r = 0; r < world; ++r)
        for (std::uint32_t g = rank_begin[r]; g < rank_begin[r + 1]; ++g)
          if (!(st[g].flags & kDone))
            throw Error(ErrorCode::InvalidUsage, "plans deadlock in simulation: rank " + std::to_string(r) +
                                                     " step " + std::to_string(g - rank_begin[r]) +
                                                     " never completes");
    }
  }
};

}  // namespace

Prediction simulate(const PlanRequest& base_in, const Topology& topo, const CostModel& model,
                    const SimOptions& options, const PlanBuilder& builder) {
  if (base_in.world < 1) throw Error(ErrorCode::InvalidUsage, "simulate: world must be >= 1");
  const auto world = static_cast<std::size_t>(base_in.world);
  if (!topo.host_of.empty() && topo.host_of.size() != world)
    throw Error(ErrorCode::InvalidUsage, "simulate: topology has " + std::to_string(topo.host_of.size()) +
                                             " ranks, the request " + std::to_string(world));
  PlanRequest base = base_in;
  std::vector<int> host = topo.host_of.empty() ? std::vector<int>(world, 0) : topo.host_of;
  int max_host = 0;
  for (int h : host) {
    if (h < 0) throw Error(ErrorCode::InvalidUsage, "simulate: negative host index in topology");
    max_host = std::max(max_host, h);
  }
  if (!base.host_of) base.host_of = std::make_shared<const std::vector<int>>(host);

  // Keep the step count manageable: grow the slice while it shrinks the plans.
  if (base.slice_bytes == 0) base.slice_bytes = 1;
  {
    base.rank = 0;
    std::uint64_t est = builder(base)->steps.size() * static_cast<std::uint64_t>(world);
    while (est > options.max_steps && base.slice_bytes < (std::size_t{1} << 62)) {
      PlanRequest bigger = base;
      bigger.slice_bytes = base.slice_bytes * 2;
      const std::uint64_t e2 = builder(bigger)->steps.size() * static_cast<std::uint64_t>(world);
      if (e2 >= est) break;
      base = bigger;
      est = e2;
    }
  }

  Sim sim;
  sim.host = std::move(host);
  sim.intra = model[topo.intra];
  sim.inter = model[topo.inter];
  // One class for both (all-TCP, say): intra- and inter-host traffic share a port.
  sim.intra_is_inter_port = topo.intra == topo.inter;
  sim.nic_beta = topo.nic_bytes_per_s > 0 ? 1.0 / topo.nic_bytes_per_s : 0.0;
  sim.gamma = model.gamma;
  sim.copy_beta = model.copy_beta;
  sim.peers.resize(world);
  sim.head_send.resize(world);
  sim.head_recv.resize(world);
  sim.rank_begin.reserve(world + 1);
  sim.rank_begin.push_back(0);
  for (std::size_t r = 0; r < world; ++r) {
    PlanRequest req = base;
    req.rank = static_cast<int>(r);
    const auto plan = builder(req);
    if (r == 0) {
      const std::size_t guess = plan->steps.size() * world;
      sim.st.reserve(guess + 1);
      sim.rdeps.reserve(guess);
    }
    sim.add_rank(static_cast<int>(r), *plan);
  }
  SimStep sentinel;
  sim.st.push_back(sentinel);
  sim.st.back().rdep_begin = static_cast<std::uint32_t>(sim.rdeps.size());
  sim.st.back().flags = kDone;
  sim.match_messages();
  sim.out_free.assign(world * 2, 0.0);
  sim.in_free.assign(world * 2, 0.0);
  sim.nic_out.assign(static_cast<std::size_t>(max_host) + 1, 0.0);
  sim.nic_in.assign(static_cast<std::size_t>(max_host) + 1, 0.0);
  sim.comp_free.assign(world, 0.0);
  sim.run();

  Prediction p;
  p.seconds = sim.makespan;
  p.steps = sim.num_steps();
  p.messages = sim.messages;
  p.wire_bytes = sim.wire_bytes;
  p.slice_bytes = base.slice_bytes;
  return p;
}

double predict_seconds(const PlanRequest& base, const Topology& topo, const CostModel& model) {
  return simulate(base, topo, model).seconds;
}

double bus_factor(Collective c, int world) noexcept {
  const double n = world;
  if (world <= 1) return c == Collective::broadcast || c == Collective::reduce ? 1.0 : 0.0;
  switch (c) {
    case Collective::allreduce: return 2.0 * (n - 1) / n;
    case Collective::allgather:
    case Collective::reduce_scatter:
    case Collective::alltoall:
    case Collective::gather:
    case Collective::scatter:
    case Collective::allgatherv:
    case Collective::reduce_scatter_v:
    case Collective::alltoallv: return (n - 1) / n;
    case Collective::broadcast:
    case Collective::reduce: return 1.0;
  }
  return 1.0;
}

double size_bytes(Collective c, std::uint64_t count, std::size_t elem_size, int world) noexcept {
  const BufferCounts bc = buffer_counts(PlanRequest(c, world, count));
  return static_cast<double>(std::max(bc.input, bc.output)) * static_cast<double>(elem_size);
}

double closed_form_seconds(Collective c, Algorithm algorithm, int world, double bytes, const LinkCost& link,
                           double gamma) {
  const AlgorithmRow* row = find_algorithm(c, algorithm);
  if (!row || !row->closed_form)
    throw Error(ErrorCode::Unsupported, std::string("no closed form for ") + to_string(c) + "/" +
                                            std::string(braid::to_string(algorithm)));
  if (world <= 1) return 0.0;
  return row->closed_form(world, bytes, link, gamma);
}

double closed_form_hierarchical(int world, int ranks_per_host, double bytes, const LinkCost& intra,
                                const LinkCost& inter, double gamma) {
  const int L = std::max(1, std::min(ranks_per_host, world));
  const int H = (world + L - 1) / L;
  const double l = L, h = H, N = bytes;
  double t = 0;
  if (L > 1) t += 2 * (l - 1) * intra.alpha + 2 * (l - 1) / l * N * intra.beta + (l - 1) / l * N * gamma;
  if (H > 1) t += 2 * (h - 1) * inter.alpha + 2 * (h - 1) / h * (N / l) * inter.beta + (h - 1) / h * (N / l) * gamma;
  return t;
}

// Weighted least squares on the relative error (weights 1/seconds²): timing noise is
// roughly proportional to the time, and plain least squares would let the large
// messages' noise swamp α, which only the small messages measure.
namespace {
struct Sums {
  double w = 0, x = 0, y = 0, xx = 0, xy = 0;
  std::size_t n = 0;
};
Sums weighted_sums(const std::vector<Sample>& samples) {
  Sums s;
  for (const auto& p : samples) {
    if (!(p.seconds > 0) || !(p.bytes >= 0) || !std::isfinite(p.seconds) || !std::isfinite(p.bytes)) continue;
    const double w = 1.0 / (p.seconds * p.seconds);
    s.w += w, s.x += w * p.bytes, s.y += w * p.seconds, s.xx += w * p.bytes * p.bytes, s.xy += w * p.bytes * p.seconds;
    ++s.n;
  }
  return s;
}
double fit_through_origin(const std::vector<Sample>& samples, double fallback) {
  const Sums s = weighted_sums(samples);
  return (s.xx > 0 && s.xy > 0) ? s.xy / s.xx : fallback;
}
}  // namespace

LinkCost fit_link(const std::vector<Sample>& samples, const LinkCost& fallback) {
  const Sums s = weighted_sums(samples);
  if (s.n == 0) return fallback;
  const double det = s.w * s.xx - s.x * s.x;
  LinkCost out;
  out.eager = fallback.eager;
  // det ~ 0: a single distinct size, the slope is unknown.
  out.beta = det > 1e-12 * s.w * s.xx ? (s.w * s.xy - s.x * s.y) / det : 0.0;
  if (!(out.beta > 0)) out.beta = fallback.beta;
  out.alpha = (s.y - out.beta * s.x) / s.w;
  if (out.alpha < 0) {
    // The best line through the origin instead: latency below resolution.
    out.alpha = 0;
    out.beta = fit_through_origin(samples, out.beta);
  }
  return out;
}

CostModel calibrate(const CostModel& base, const CalibrationSamples& samples) {
  CostModel m = base;
  for (const auto& [cls, v] : samples.links) {
    if (static_cast<int>(cls) >= kNumLinkClasses) throw Error(ErrorCode::InvalidUsage, "calibrate: unknown link class");
    m[cls] = fit_link(v, base[cls]);
  }
  if (!samples.reduce.empty()) m.gamma = fit_through_origin(samples.reduce, base.gamma);
  if (!samples.copy.empty()) m.copy_beta = fit_through_origin(samples.copy, base.copy_beta);
  return m;
}

}  // namespace braid::collectives
