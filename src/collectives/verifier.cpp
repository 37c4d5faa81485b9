// Symbolic execution of all ranks' plans (see verifier.hpp).
#include "collectives/verifier.hpp"

#include <braid/error.hpp>

#include <algorithm>
#include <deque>
#include <random>
#include <sstream>

namespace braid::collectives {

namespace {

std::uint64_t mix(std::uint64_t x) noexcept {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
std::uint64_t leaf_hash(int rank, std::uint64_t index) noexcept {
  return mix(mix(static_cast<std::uint64_t>(rank) + 0x5bd1e995ull) ^ index);
}
// Commutative, not associative: the shape of the reduction tree is what counts.
std::uint64_t combine_hash(std::uint64_t a, std::uint64_t b) noexcept {
  const std::uint64_t lo = std::min(a, b), hi = std::max(a, b);
  return mix(lo ^ mix(hi + 0x2545f4914f6cdd1dull));
}

struct Elem {
  std::uint64_t mask = 0;   ///< contributing ranks; 0 = undefined
  std::uint64_t index = 0;  ///< index in the contributors' inputs
  std::uint64_t hash = 0;   ///< expression that produced it
  bool finalized = false;
  std::uint8_t quant = 0;   ///< times quantised (encoded) on the way
  bool scaled = false;      ///< premul_sum: multiplied by the factor (leaves only, once)
};

struct Lock {
  std::uint32_t readers = 0;
  bool writer = false;
};

struct VerifyFailure {
  std::string what;
};

enum : std::uint8_t { kWaiting = 0, kPosted = 1, kDone = 2 };

const char* buffer_name(Buffer b) {
  switch (b) {
    case Buffer::input: return "input";
    case Buffer::output: return "output";
    case Buffer::scratch: return "scratch";
    case Buffer::packed: return "packed";
    case Buffer::feedback_worker: return "worker residual";
    case Buffer::feedback_owner: return "owner residual";
  }
  return "?";
}

bool reduces(Collective c) {
  return c == Collective::allreduce || c == Collective::reduce || c == Collective::reduce_scatter ||
         c == Collective::reduce_scatter_v;
}

// Where a plan's buffer lives in a rank's memory: storage `phys` from element `base`.
struct View {
  int phys = 0;
  std::uint64_t base = 0;
  std::uint64_t size = 0;
};

struct RankSim {
  int rank = 0;
  std::shared_ptr<const Plan> plan;
  View view[kNumBuffers];
  std::vector<Elem> mem[kNumBuffers];
  std::vector<Lock> lock[kNumBuffers];
  // Residual element j of feedback buffer f: times used this call, and the index of
  // the values it was added to (the same for every use: residuals line up with values).
  std::vector<std::uint32_t> residual_uses[2];
  std::vector<std::uint64_t> residual_index[2];
  std::vector<std::uint8_t> state;
  std::vector<int> peers;
  std::vector<std::vector<std::uint32_t>> sendq, recvq;  // by peer rank
  std::vector<std::size_t> send_head, recv_head;         // posted so far
  std::vector<std::size_t> send_done, recv_done;         // completed so far
  std::vector<std::uint32_t> localq;
  std::size_t local_head = 0;
  std::size_t done = 0;
  std::size_t staging_used = 0;

  struct Span {
    int phys;
    std::uint64_t begin, end;
  };
  Span span(const Region& r) const {
    const View& v = view[static_cast<int>(r.buf)];
    return {v.phys, v.base + r.offset, v.base + r.offset + r.count};
  }
};

struct Action {
  std::uint32_t step;
  std::uint8_t kind;  // 0 post, 1 complete send, 2 complete recv
};

struct Sim {
  PlanRequest req;
  VerifyOptions opt;
  int world = 1;
  std::uint64_t full = 0;
  bool avg = false;
  bool premul = false;         ///< premul_sum: every contribution is scaled once, before any reduction
  std::uint8_t quantised = 0;  ///< times every output value is quantised (codec plans)
  std::vector<RankSim> ranks;
  std::vector<std::deque<std::vector<Elem>>> channels;  // [from * world + to]
  VerifyResult result;

  std::deque<std::vector<Elem>>& channel(int from, int to) {
    return channels[static_cast<std::size_t>(from) * static_cast<std::size_t>(world) + static_cast<std::size_t>(to)];
  }

  [[noreturn]] void fail(const RankSim& rs, std::uint32_t step, const std::string& what) {
    std::ostringstream os;
    const auto& names = rs.plan->phase_names;
    const auto phase = rs.plan->steps[step].phase;
    os << "rank " << rs.rank << " step " << step << " (" << (phase < names.size() ? names[phase] : "?")
       << "): " << what;
    throw VerifyFailure{os.str()};
  }

  void check_region(RankSim& rs, std::uint32_t i, const Region& r, bool write) {
    const auto b = static_cast<int>(r.buf);
    if (b < 0 || b >= kNumBuffers) fail(rs, i, "names an unknown buffer");
    const View& v = rs.view[b];
    if (r.offset + r.count > v.size || r.offset + r.count < r.offset)
      fail(rs, i, std::string(buffer_name(r.buf)) + " region [" + std::to_string(r.offset) + ", +" +
                      std::to_string(r.count) + ") outside its buffer of " + std::to_string(v.size) + " elements");
    if (write && r.buf == Buffer::input) fail(rs, i, "writes its input buffer (inputs are read-only)");
    if (r.buf == Buffer::packed && r.offset % rs.plan->packed_frame != 0)
      fail(rs, i, "packed region at " + std::to_string(r.offset) + " is not aligned to the frame of " +
                      std::to_string(rs.plan->packed_frame) + " values");
    const bool codec_buf = r.buf == Buffer::packed || r.buf == Buffer::feedback_worker || r.buf == Buffer::feedback_owner;
    if (codec_buf && req.codec.kind == compression::CodecKind::none)
      fail(rs, i, "addresses " + std::string(buffer_name(r.buf)) + " in a plan without a codec");
  }

  bool deps_done(const RankSim& rs, std::uint32_t i) const {
    const Step& s = rs.plan->steps[i];
    for (std::uint32_t d = 0; d < s.dep_count; ++d)
      if (rs.state[rs.plan->deps[s.dep_begin + d]] != kDone) return false;
    return true;
  }

  static bool overlap(const RankSim::Span& a, const RankSim::Span& b) {
    return a.phys == b.phys && a.begin < b.end && b.begin < a.end;
  }
  static bool same(const RankSim::Span& a, const RankSim::Span& b) {
    return a.phys == b.phys && a.begin == b.begin && a.end == b.end;
  }
  bool needs_staging(const RankSim& rs, const Step& s) const {
    return s.kind == StepKind::recv_reduce && s.src.count > 0 && overlap(rs.span(s.src), rs.span(s.dst));
  }

  void lock_read(RankSim& rs, std::uint32_t i, const Region& r) {
    const auto sp = rs.span(r);
    auto& l = rs.lock[sp.phys];
    for (std::uint64_t e = sp.begin; e < sp.end; ++e) {
      if (l[e].writer)
        fail(rs, i, "reads " + std::string(buffer_name(r.buf)) + " element " + std::to_string(e - sp.begin + r.offset) +
                        " while another step writes it (race)");
      ++l[e].readers;
    }
  }
  void lock_write(RankSim& rs, std::uint32_t i, const Region& r) {
    const auto sp = rs.span(r);
    auto& l = rs.lock[sp.phys];
    for (std::uint64_t e = sp.begin; e < sp.end; ++e) {
      if (l[e].writer || l[e].readers)
        fail(rs, i, "writes " + std::string(buffer_name(r.buf)) + " element " + std::to_string(e - sp.begin + r.offset) +
                        " while another step uses it (race)");
      l[e].writer = true;
    }
  }
  void unlock_read(RankSim& rs, const Region& r) {
    const auto sp = rs.span(r);
    for (std::uint64_t e = sp.begin; e < sp.end; ++e) --rs.lock[sp.phys][e].readers;
  }
  void unlock_write(RankSim& rs, const Region& r) {
    const auto sp = rs.span(r);
    for (std::uint64_t e = sp.begin; e < sp.end; ++e) rs.lock[sp.phys][e].writer = false;
  }

  std::vector<Elem> read(RankSim& rs, std::uint32_t i, const Region& r) {
    const auto sp = rs.span(r);
    const auto& m = rs.mem[sp.phys];
    std::vector<Elem> out(m.begin() + static_cast<std::ptrdiff_t>(sp.begin), m.begin() + static_cast<std::ptrdiff_t>(sp.end));
    for (std::uint64_t e = 0; e < out.size(); ++e)
      if (out[e].mask == 0)
        fail(rs, i, "reads undefined " + std::string(buffer_name(r.buf)) + " element " + std::to_string(r.offset + e));
    return out;
  }
  void write(RankSim& rs, const Region& r, const std::vector<Elem>& data) {
    const auto sp = rs.span(r);
    std::copy(data.begin(), data.end(), rs.mem[sp.phys].begin() + static_cast<std::ptrdiff_t>(sp.begin));
  }

  Elem reduce_one(RankSim& rs, std::uint32_t i, const Elem& a, const Elem& b, std::uint64_t at) {
    if (a.mask == 0 || b.mask == 0) fail(rs, i, "reduces an undefined element at " + std::to_string(at));
    if (a.finalized || b.finalized) fail(rs, i, "reduces an element that was already finalized");
    if (a.index != b.index)
      fail(rs, i, "reduces element " + std::to_string(a.index) + " with element " + std::to_string(b.index) +
                      " (at destination element " + std::to_string(at) + ")");
    if (a.mask & b.mask) fail(rs, i, "counts a contribution twice at element " + std::to_string(at));
    if (premul && !(a.scaled && b.scaled))
      fail(rs, i, "reduces a contribution that was not scaled (premul_sum) at element " + std::to_string(at));
    return Elem{a.mask | b.mask, a.index, combine_hash(a.hash, b.hash), false, std::max(a.quant, b.quant), premul};
  }

  // premul_sum: element x of this rank's input, multiplied by the factor (a scale step, or
  // a reduction's scale_src operand). Only this rank's own contribution, only once.
  Elem scaled(RankSim& rs, std::uint32_t i, Elem x, std::uint64_t at) {
    if (!premul) fail(rs, i, "scales although the call is not a premul_sum");
    if (x.scaled || x.mask != (1ull << rs.rank))
      fail(rs, i, "scales element " + std::to_string(at) +
                      ", which is not this rank's own unscaled input (scaled twice, or after a reduction)");
    x.scaled = true;
    return x;
  }

  void finalize(RankSim& rs, std::uint32_t i, const Region& r) {
    if (!avg || !reduces(req.collective)) fail(rs, i, "finalizes although nothing needs a finishing step");
    const auto sp = rs.span(r);
    auto& m = rs.mem[sp.phys];
    for (std::uint64_t e = sp.begin; e < sp.end; ++e) {
      if (m[e].finalized) fail(rs, i, "finalizes element " + std::to_string(e - sp.begin + r.offset) + " twice");
      if (m[e].mask != full)
        fail(rs, i, "finalizes element " + std::to_string(e - sp.begin + r.offset) + " before all ranks contributed");
      m[e].finalized = true;
    }
  }

  void complete(RankSim& rs, std::uint32_t i) {
    rs.state[i] = kDone;
    ++rs.done;
  }

  // A local step's src (checked, same size as dst) as it is now.
  std::vector<Elem> read_src(RankSim& rs, std::uint32_t i, const char* what) {
    const Step& s = rs.plan->steps[i];
    check_region(rs, i, s.src, false);
    check_region(rs, i, s.dst, true);
    if (s.src.count != s.dst.count) fail(rs, i, std::string(what) + " with src and dst of different sizes");
    return read(rs, i, s.src);
  }

  // Completes local step i by writing `data` to its dst (nobody else may be using dst),
  // finalizing it when the step says so.
  void store(RankSim& rs, std::uint32_t i, const std::vector<Elem>& data) {
    const Step& s = rs.plan->steps[i];
    lock_write(rs, i, s.dst);
    unlock_write(rs, s.dst);
    write(rs, s.dst, data);
    if (s.finalize) finalize(rs, i, s.dst);
    complete(rs, i);
  }

  // Post step i of rank rs (its queue head, dependencies met).
  void post(RankSim& rs, std::uint32_t i) {
    const Step& s = rs.plan->steps[i];
    switch (s.kind) {
      case StepKind::send:
        check_region(rs, i, s.src, false);
        lock_read(rs, i, s.src);
        rs.state[i] = kPosted;
        break;
      case StepKind::recv:
        check_region(rs, i, s.dst, true);
        lock_write(rs, i, s.dst);
        rs.state[i] = kPosted;
        break;
      case StepKind::recv_reduce: {
        check_region(rs, i, s.src, false);
        check_region(rs, i, s.dst, true);
        if (s.src.count != s.dst.count) fail(rs, i, "src and dst sizes differ");
        const auto a = rs.span(s.src), d = rs.span(s.dst);
        if (overlap(a, d) && !same(a, d)) fail(rs, i, "src and dst overlap without being the same elements");
        lock_write(rs, i, s.dst);
        if (!same(a, d)) lock_read(rs, i, s.src);  // the engine reads src when the message is in
        if (needs_staging(rs, s)) ++rs.staging_used;
        rs.state[i] = kPosted;
        break;
      }
      case StepKind::reduce: {
        check_region(rs, i, s.src, false);
        check_region(rs, i, s.src2, false);
        check_region(rs, i, s.dst, true);
        if (s.src.count != s.dst.count || s.src2.count != s.dst.count) fail(rs, i, "reduce with operands of different sizes");
        const auto d = rs.span(s.dst);
        for (const auto& op : {rs.span(s.src), rs.span(s.src2)})
          if (overlap(op, d) && !same(op, d)) fail(rs, i, "reduce whose operand overlaps dst without being dst");
        auto a = read(rs, i, s.src);
        auto b = read(rs, i, s.src2);
        if (s.scale_src)
          for (std::uint64_t e = 0; e < a.size(); ++e) a[e] = scaled(rs, i, a[e], s.src.offset + e);
        for (std::uint64_t e = 0; e < a.size(); ++e) a[e] = reduce_one(rs, i, a[e], b[e], s.dst.offset + e);
        result.reduced[static_cast<std::size_t>(rs.rank)] += a.size();
        store(rs, i, a);
        break;
      }
      case StepKind::copy:
        store(rs, i, read_src(rs, i, "copy"));
        break;
      case StepKind::scale: {
        auto data = read_src(rs, i, "scale");
        for (std::uint64_t e = 0; e < data.size(); ++e) data[e] = scaled(rs, i, data[e], s.src.offset + e);
        store(rs, i, data);
        break;
      }
      case StepKind::encode: {
        if (s.dst.buf != Buffer::packed || s.src.buf == Buffer::packed)
          fail(rs, i, "encodes from " + std::string(buffer_name(s.src.buf)) + " into " + buffer_name(s.dst.buf) +
                          " (values into packed only)");
        auto data = read_src(rs, i, "encode");
        if (s.src2.count > 0) {
          check_region(rs, i, s.src2, true);
          if (s.src2.buf != Buffer::feedback_worker && s.src2.buf != Buffer::feedback_owner)
            fail(rs, i, "takes its residual from " + std::string(buffer_name(s.src2.buf)));
          if (s.src2.count != s.src.count) fail(rs, i, "residual and src sizes differ");
          const int f = s.src2.buf == Buffer::feedback_worker ? 0 : 1;
          lock_write(rs, i, s.src2);
          unlock_write(rs, s.src2);
          for (std::uint64_t e = 0; e < data.size(); ++e) {
            const std::uint64_t j = s.src2.offset + e;
            if (rs.residual_uses[f][j]++ > 0)
              fail(rs, i, "uses " + std::string(buffer_name(s.src2.buf)) + " element " + std::to_string(j) +
                              " twice in one call");
            auto& idx = rs.residual_index[f][j];
            if (idx != ~0ull && idx != data[e].index)
              fail(rs, i, std::string(buffer_name(s.src2.buf)) + " element " + std::to_string(j) +
                              " is added to element " + std::to_string(data[e].index) + " but was carried for " +
                              std::to_string(idx));
            idx = data[e].index;
          }
        }
        // The bytes depend on the values and on who encodes them with which RNG stream.
        const std::uint64_t who = mix((static_cast<std::uint64_t>(rs.rank) << 40) ^
                                      (static_cast<std::uint64_t>(s.stream) << 32) ^
                                      static_cast<std::uint32_t>(s.stream_rank));
        for (auto& x : data) {
          x.hash = mix(x.hash ^ who);
          ++x.quant;
        }
        store(rs, i, data);
        break;
      }
      case StepKind::decode:
      case StepKind::decode_add: {
        if (s.src.buf != Buffer::packed || s.dst.buf == Buffer::packed)
          fail(rs, i, "decodes from " + std::string(buffer_name(s.src.buf)) + " into " + buffer_name(s.dst.buf) +
                          " (packed into values only)");
        auto data = read_src(rs, i, "decode");
        if (s.kind == StepKind::decode_add) {
          const auto acc = read(rs, i, s.dst);
          for (std::uint64_t e = 0; e < data.size(); ++e) data[e] = reduce_one(rs, i, acc[e], data[e], s.dst.offset + e);
          result.reduced[static_cast<std::size_t>(rs.rank)] += data.size();
        }
        store(rs, i, data);
        break;
      }
      default: fail(rs, i, "has an unknown kind");
    }
  }

  void complete_send(RankSim& rs, std::uint32_t i) {
    const Step& s = rs.plan->steps[i];
    auto data = read(rs, i, s.src);
    unlock_read(rs, s.src);
    const auto r = static_cast<std::size_t>(rs.rank);
    ++result.messages;
    result.bytes += data.size();
    result.sent[r] += data.size();
    ++result.sends[r];
    result.received[static_cast<std::size_t>(s.peer)] += data.size();
    result.traffic[r * static_cast<std::size_t>(world) + static_cast<std::size_t>(s.peer)] += data.size();
    channel(rs.rank, s.peer).push_back(std::move(data));
    complete(rs, i);
  }

  void complete_recv(RankSim& rs, std::uint32_t i) {
    const Step& s = rs.plan->steps[i];
    auto& q = channel(s.peer, rs.rank);
    std::vector<Elem> msg = std::move(q.front());
    q.pop_front();
    if (msg.size() != s.dst.count)
      fail(rs, i, "expects " + std::to_string(s.dst.count) + " elements from rank " + std::to_string(s.peer) +
                      " but the matching message has " + std::to_string(msg.size()));
    if (s.kind == StepKind::recv_reduce) {
      const auto a = rs.span(s.src), d = rs.span(s.dst);
      const auto& src = rs.mem[a.phys];
      for (std::uint64_t e = 0; e < msg.size(); ++e) {
        const Elem mine = s.scale_src ? scaled(rs, i, src[a.begin + e], s.src.offset + e) : src[a.begin + e];
        msg[e] = reduce_one(rs, i, mine, msg[e], s.dst.offset + e);
      }
      if (!same(a, d)) unlock_read(rs, s.src);
      if (needs_staging(rs, s)) --rs.staging_used;
      result.reduced[static_cast<std::size_t>(rs.rank)] += msg.size();
    }
    write(rs, s.dst, msg);
    unlock_write(rs, s.dst);
    if (s.finalize) finalize(rs, i, s.dst);
    complete(rs, i);
  }

  // Actions rank rs can take now.
  void actions_of(const RankSim& rs, std::vector<Action>& out) const {
    out.clear();
    for (int peer : rs.peers) {
      const auto p = static_cast<std::size_t>(peer);
      if (rs.send_head[p] < rs.sendq[p].size() && deps_done(rs, rs.sendq[p][rs.send_head[p]]))
        out.push_back({rs.sendq[p][rs.send_head[p]], 0});
      if (rs.recv_head[p] < rs.recvq[p].size()) {
        const std::uint32_t i = rs.recvq[p][rs.recv_head[p]];
        if (deps_done(rs, i) && (opt.staging_slots == 0 || rs.staging_used < opt.staging_slots ||
                                 !needs_staging(rs, rs.plan->steps[i])))
          out.push_back({i, 0});
      }
      if (rs.send_done[p] < rs.send_head[p]) {
        const auto& other = ranks[p];
        if (!opt.rendezvous || other.recv_head[static_cast<std::size_t>(rs.rank)] > rs.send_done[p])
          out.push_back({rs.sendq[p][rs.send_done[p]], 1});
      }
      if (rs.recv_done[p] < rs.recv_head[p] &&
          !channels[p * static_cast<std::size_t>(world) + static_cast<std::size_t>(rs.rank)].empty())
        out.push_back({rs.recvq[p][rs.recv_done[p]], 2});
    }
    if (rs.local_head < rs.localq.size() && deps_done(rs, rs.localq[rs.local_head]))
      out.push_back({rs.localq[rs.local_head], 0});
  }

  // alltoallv: rank r's view of the whole matrix (what it sends, then what it receives).
  std::shared_ptr<const std::vector<std::uint64_t>> alltoallv_view(int r) const {
    const auto n = static_cast<std::size_t>(world), rr = static_cast<std::size_t>(r);
    auto v = std::make_shared<std::vector<std::uint64_t>>(2 * n, 0);
    if (req.counts && req.counts->size() == n * n)
      for (std::size_t j = 0; j < n; ++j) {
        (*v)[j] = (*req.counts)[rr * n + j];
        (*v)[n + j] = (*req.counts)[j * n + rr];
      }
    return v;
  }

  void setup_rank(RankSim& rs, const PlanBuilder& builder) {
    PlanRequest r = req;
    r.rank = rs.rank;
    if (req.collective == Collective::alltoallv) r.counts = alltoallv_view(rs.rank);
    rs.plan = builder(r);
    const BufferCounts bc = buffer_counts(r);
    const std::uint64_t rr = static_cast<std::uint64_t>(rs.rank);
    View& in = rs.view[0];
    View& out = rs.view[1];
    in = {0, 0, bc.input};
    out = {1, 0, bc.output};
    if (opt.in_place && bc.input > 0 && bc.output > 0) {
      switch (req.collective) {
        case Collective::allgather:
        case Collective::gather: in = {1, rr * req.count, bc.input}; break;
        case Collective::reduce_scatter:
        case Collective::scatter: out = {0, rr * req.count, bc.output}; break;
        case Collective::allgatherv: in = {1, rank_blocks(r).at[rr], bc.input}; break;
        case Collective::reduce_scatter_v: out = {0, rank_blocks(r).at[rr], bc.output}; break;
        default: in = {1, 0, bc.input}; break;
      }
    }
    const Plan& pl = *rs.plan;
    rs.view[2] = {2, 0, pl.scratch_count};
    rs.view[3] = {3, 0, pl.packed_count};
    rs.view[4] = {4, 0, pl.feedback_count[0]};
    rs.view[5] = {5, 0, pl.feedback_count[1]};
    std::uint64_t size[kNumBuffers] = {0, 0, pl.scratch_count, pl.packed_count, pl.feedback_count[0],
                                       pl.feedback_count[1]};
    for (int b = 0; b < 2; ++b) size[rs.view[b].phys] = std::max(size[rs.view[b].phys], rs.view[b].base + rs.view[b].size);
    for (int f = 0; f < 2; ++f) {
      rs.residual_uses[f].assign(pl.feedback_count[f], 0);
      rs.residual_index[f].assign(pl.feedback_count[f], ~0ull);
    }
    if (pl.packed_frame == 0) throw VerifyFailure{"rank " + std::to_string(rs.rank) + ": packed frame of 0 values"};
    for (int b = 0; b < kNumBuffers; ++b) {
      rs.mem[b].assign(size[b], Elem{});
      rs.lock[b].assign(size[b], Lock{});
    }
    for (std::uint64_t x = 0; x < in.size; ++x)
      rs.mem[in.phys][in.base + x] = Elem{1ull << rs.rank, x, leaf_hash(rs.rank, x), false};

    const Plan& p = *rs.plan;
    const auto n = static_cast<std::size_t>(world);
    rs.state.assign(p.steps.size(), kWaiting);
    rs.sendq.assign(n, {});
    rs.recvq.assign(n, {});
    rs.send_head.assign(n, 0);
    rs.recv_head.assign(n, 0);
    rs.send_done.assign(n, 0);
    rs.recv_done.assign(n, 0);
    std::vector<bool> is_peer(n, false);
    for (std::uint32_t i = 0; i < p.steps.size(); ++i) {
      const Step& s = p.steps[i];
      if (static_cast<std::uint64_t>(s.dep_begin) + s.dep_count > p.deps.size()) fail(rs, i, "has dependencies outside the plan");
      for (std::uint32_t d = 0; d < s.dep_count; ++d)
        if (p.deps[s.dep_begin + d] >= i) fail(rs, i, "depends on itself or a later step");
      if (is_local(s.kind)) {
        rs.localq.push_back(i);
        continue;
      }
      if (s.peer < 0 || s.peer >= world || s.peer == rs.rank) fail(rs, i, "has an invalid peer");
      (s.kind == StepKind::send ? rs.sendq : rs.recvq)[static_cast<std::size_t>(s.peer)].push_back(i);
      is_peer[static_cast<std::size_t>(s.peer)] = true;
    }
    for (std::size_t q = 0; q < n; ++q)
      if (is_peer[q]) rs.peers.push_back(static_cast<int>(q));
  }

  void run() {
    const auto n = static_cast<std::size_t>(world);
    std::mt19937_64 rng(opt.seed);
    std::vector<std::vector<Action>> acts(n);
    std::vector<std::size_t> posts(n, 0);  // post actions among acts[r]
    std::size_t total = 0, total_posts = 0;
    auto refresh = [&](std::size_t r) {
      total -= acts[r].size();
      total_posts -= posts[r];
      actions_of(ranks[r], acts[r]);
      posts[r] = static_cast<std::size_t>(
          std::count_if(acts[r].begin(), acts[r].end(), [](const Action& x) { return x.kind == 0; }));
      total += acts[r].size();
      total_posts += posts[r];
    };
    for (std::size_t r = 0; r < n; ++r) refresh(r);
    for (;;) {
      if (total == 0) break;
      std::size_t who = 0;
      Action a{};
      if (opt.post_first && total_posts > 0) {
        std::size_t pick = static_cast<std::size_t>(rng() % total_posts);
        while (pick >= posts[who]) pick -= posts[who++];
        for (const Action& x : acts[who])
          if (x.kind == 0 && pick-- == 0) {
            a = x;
            break;
          }
      } else {
        std::size_t pick = static_cast<std::size_t>(rng() % total);
        while (pick >= acts[who].size()) pick -= acts[who++].size();
        a = acts[who][pick];
      }
      RankSim& rs = ranks[who];
      const Step& s = rs.plan->steps[a.step];
      const auto p = static_cast<std::size_t>(s.peer < 0 ? 0 : s.peer);
      if (a.kind == 0) {
        if (s.kind == StepKind::send) ++rs.send_head[p];
        else if (is_local(s.kind)) ++rs.local_head;
        else ++rs.recv_head[p];
        post(rs, a.step);
      } else if (a.kind == 1) {
        ++rs.send_done[p];
        complete_send(rs, a.step);
      } else {
        ++rs.recv_done[p];
        complete_recv(rs, a.step);
      }
      // Only this rank and the step's peer can have gained or lost actions.
      for (std::size_t r : {who, p}) {
        refresh(r);
        if (s.peer < 0) break;
      }
    }
    bool all_done = true;
    for (auto& rs : ranks) all_done = all_done && rs.done == rs.plan->steps.size();
    if (!all_done) {
      std::ostringstream os;
      os << "deadlock: no step can run;";
      for (auto& rs : ranks)
        for (std::uint32_t i = 0; i < rs.plan->steps.size(); ++i)
          if (rs.state[i] != kDone) {
            os << " rank " << rs.rank << " step " << i << (rs.state[i] == kPosted ? " (posted)" : " (waiting)");
            if (opt.staging_slots && rs.staging_used >= opt.staging_slots) os << " with all staging buffers in use";
            os << ";";
            break;
          }
      throw VerifyFailure{os.str()};
    }
    for (int from = 0; from < world; ++from)
      for (int to = 0; to < world; ++to)
        if (!channel(from, to).empty())
          throw VerifyFailure{std::to_string(channel(from, to).size()) + " message(s) from rank " + std::to_string(from) +
                              " to rank " + std::to_string(to) + " were never received"};
  }

  // The block of `l` that holds element e (the last of equal offsets: empty blocks hold none).
  static std::size_t block_of(const BlockLayout& l, std::uint64_t e) {
    const auto it = std::upper_bound(l.at.begin(), l.at.end(), e);
    return static_cast<std::size_t>(it - l.at.begin()) - 1;
  }

  // The hash of ((x0 op x1) op x2) ... op x(n-1) at index `index`.
  std::uint64_t fold_hash(std::uint64_t index) const {
    std::uint64_t h = leaf_hash(0, index);
    for (int r = 1; r < world; ++r) h = combine_hash(h, leaf_hash(r, index));
    return h;
  }

  static std::string describe(const Elem& e) {
    if (e.mask == 0) return "undefined";
    std::ostringstream os;
    os << "element " << e.index << " of contributions 0x" << std::hex << e.mask << (e.finalized ? " (finalized)" : "");
    return os.str();
  }

  void check_output(const RankSim& rs, std::uint64_t e, const Elem& got, std::uint64_t mask, std::uint64_t index,
                    bool reduced, const Elem* same_as) {
    const View& v = rs.view[1];
    const Elem& x = got;
    const bool fin = reduced && avg;
    std::string why;
    if (reduced && premul && !x.scaled) {
      why = "holds " + describe(x) + ", which was never scaled (premul_sum)";
    } else if (x.mask != mask || x.index != index || x.finalized != fin) {
      Elem want{mask, index, 0, fin};
      why = "holds " + describe(x) + ", expected " + describe(want);
    } else if (reduced && req.deterministic && x.hash != fold_hash(index)) {
      why = "was not reduced in rank order 0, 1, ..., n-1 (deterministic mode)";
    } else if (same_as && x.hash != same_as->hash) {
      why = x.quant > 0 ? "was decoded from other bytes than rank 0's (results would not be bitwise identical)"
                        : "differs in reduction order from rank 0's (results would not be bitwise identical)";
    } else if (x.quant != quantised) {
      why = "was quantised " + std::to_string(x.quant) + " times (the codec's algorithm quantises " +
            std::to_string(quantised) + " times)";
    }
    (void)v;
    if (!why.empty())
      throw VerifyFailure{"rank " + std::to_string(rs.rank) + " output element " + std::to_string(e) + " " + why};
  }

  void check_results() {
    const std::uint64_t c = req.count;
    for (auto& rs : ranks)
      for (int f = 0; f < 2; ++f)
        for (std::uint64_t j = 0; j < rs.residual_uses[f].size(); ++j)
          if (rs.residual_uses[f][j] != 1)
            throw VerifyFailure{"rank " + std::to_string(rs.rank) + " " +
                                buffer_name(f == 0 ? Buffer::feedback_worker : Buffer::feedback_owner) + " element " +
                                std::to_string(j) + " was used " + std::to_string(rs.residual_uses[f][j]) +
                                " times (every residual element is carried into exactly one encode per call)"};
    for (auto& rs : ranks) {
      const View& v = rs.view[1];
      const auto& m = rs.mem[v.phys];
      const auto r = static_cast<std::uint64_t>(rs.rank);
      auto out = [&](std::uint64_t e) -> const Elem& { return m[v.base + e]; };
      PlanRequest mine = req;
      mine.rank = rs.rank;
      if (req.collective == Collective::alltoallv) mine.counts = alltoallv_view(rs.rank);
      const BlockLayout blocks = rank_blocks(mine), got_from = received_blocks(mine);
      // alltoallv: where each sender's block for this rank starts in its input.
      std::vector<std::uint64_t> sent_at(req.collective == Collective::alltoallv ? ranks.size() : 0);
      for (std::size_t j = 0; j < sent_at.size(); ++j) {
        PlanRequest sender = req;
        sender.rank = static_cast<int>(j);
        sender.counts = alltoallv_view(sender.rank);
        sent_at[j] = sent_blocks(sender).at[r];
      }
      for (std::uint64_t e = 0; e < v.size; ++e) {
        switch (req.collective) {
          case Collective::allreduce: {
            const Elem* ref = rs.rank == 0 ? nullptr : &ranks[0].mem[ranks[0].view[1].phys][ranks[0].view[1].base + e];
            check_output(rs, e, out(e), full, e, true, ref);
            break;
          }
          case Collective::reduce:
            if (rs.rank == req.root) check_output(rs, e, out(e), full, e, true, nullptr);
            break;
          case Collective::broadcast: check_output(rs, e, out(e), 1ull << req.root, e, false, nullptr); break;
          case Collective::allgather: check_output(rs, e, out(e), 1ull << (e / c), e % c, false, nullptr); break;
          case Collective::reduce_scatter: check_output(rs, e, out(e), full, r * c + e, true, nullptr); break;
          case Collective::alltoall: check_output(rs, e, out(e), 1ull << (e / c), r * c + e % c, false, nullptr); break;
          case Collective::gather:
            if (rs.rank == req.root) check_output(rs, e, out(e), 1ull << (e / c), e % c, false, nullptr);
            break;
          case Collective::scatter: check_output(rs, e, out(e), 1ull << req.root, r * c + e, false, nullptr); break;
          case Collective::allgatherv: {
            const std::size_t j = block_of(blocks, e);
            check_output(rs, e, out(e), 1ull << j, e - blocks.at[j], false, nullptr);
            break;
          }
          case Collective::reduce_scatter_v: check_output(rs, e, out(e), full, blocks.at[r] + e, true, nullptr); break;
          case Collective::alltoallv: {
            // Block j came from rank j: its block r, which starts at rank j's send offset for r.
            const std::size_t j = block_of(got_from, e);
            check_output(rs, e, out(e), 1ull << j, sent_at[j] + (e - got_from.at[j]), false, nullptr);
            break;
          }
        }
      }
    }
  }
};

}  // namespace

VerifyResult verify_plans(const PlanRequest& base, bool in_place, std::uint64_t seed, const PlanBuilder& builder) {
  VerifyOptions o;
  o.in_place = in_place;
  o.seed = seed;
  return verify_plans(base, o, builder);
}

VerifyResult verify_plans(const PlanRequest& base, const VerifyOptions& options, const PlanBuilder& builder) {
  Sim sim;
  sim.req = base;
  sim.opt = options;
  sim.world = base.world;
  sim.avg = base.op == ReduceOp::avg;
  sim.premul = base.op == ReduceOp::premul_sum && reduces(base.collective);
  if (base.codec.kind != compression::CodecKind::none) sim.quantised = base.codec.kind == compression::CodecKind::topk ? 1 : 2;
  if (base.world < 1 || base.world > 64) {
    sim.result.error = "the verifier handles worlds of 1..64 ranks";
    return sim.result;
  }
  if ((base.collective == Collective::broadcast || base.collective == Collective::reduce ||
       base.collective == Collective::gather || base.collective == Collective::scatter) &&
      (base.root < 0 || base.root >= base.world)) {
    sim.result.error = "root " + std::to_string(base.root) + " outside the world";
    return sim.result;
  }
  const auto n = static_cast<std::size_t>(base.world);
  sim.full = base.world == 64 ? ~0ull : ((1ull << base.world) - 1);
  sim.result.sent.assign(n, 0);
  sim.result.received.assign(n, 0);
  sim.result.sends.assign(n, 0);
  sim.result.reduced.assign(n, 0);
  sim.result.traffic.assign(n * n, 0);
  try {
    sim.ranks.resize(n);
    sim.channels.resize(n * n);
    for (int r = 0; r < base.world; ++r) {
      sim.ranks[static_cast<std::size_t>(r)].rank = r;
      sim.setup_rank(sim.ranks[static_cast<std::size_t>(r)], builder);
    }
    sim.run();
    sim.check_results();
    sim.result.ok = true;
  } catch (const VerifyFailure& f) {
    sim.result.ok = false;
    sim.result.error = f.what;
  } catch (const Error& e) {
    sim.result.ok = false;
    sim.result.error = e.what();
  }
  return sim.result;
}

}  // namespace braid::collectives
