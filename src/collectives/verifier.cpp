// Symbolic execution of all ranks' plans (see verifier.hpp).
#include "collectives/verifier.hpp"

#include <braid/error.hpp>

#include <algorithm>
#include <deque>
#include <map>
#include <random>
#include <sstream>

namespace braid::collectives {

namespace {

struct Elem {
  std::uint64_t mask = 0;
  bool finalized = false;
};

struct Lock {
  std::uint32_t readers = 0;
  bool writer = false;
};

struct VerifyFailure {
  std::string what;
};

enum : std::uint8_t { kWaiting = 0, kPosted = 1, kDone = 2 };

struct RankSim {
  int rank = 0;
  std::shared_ptr<const Plan> plan;
  std::vector<Elem> buf[3];
  std::vector<Lock> lock[3];
  std::vector<std::uint8_t> state;
  std::vector<std::vector<std::uint32_t>> sendq, recvq;
  std::vector<std::size_t> send_head, recv_head;
  std::vector<std::uint32_t> localq;
  std::size_t local_head = 0;
  std::size_t done = 0;
  bool in_place = false;

  int slot(Buffer b) const { return (in_place && b == Buffer::input) ? 1 : static_cast<int>(b); }
};

struct Sim {
  int world;
  std::uint64_t full;
  bool avg;
  std::vector<RankSim> ranks;
  std::map<std::pair<int, int>, std::deque<std::vector<Elem>>> channels;
  VerifyResult result;

  [[noreturn]] void fail(const RankSim& rs, std::uint32_t step, const std::string& what) {
    std::ostringstream os;
    os << "rank " << rs.rank << " step " << step << " ("
       << rs.plan->phase_names.at(rs.plan->steps[step].phase) << "): " << what;
    throw VerifyFailure{os.str()};
  }

  void check_bounds(RankSim& rs, std::uint32_t i, const Region& r) {
    const auto& b = rs.buf[rs.slot(r.buf)];
    if (r.offset + r.count > b.size() || r.offset + r.count < r.offset)
      fail(rs, i, "region [" + std::to_string(r.offset) + ", +" + std::to_string(r.count) +
                      ") outside its buffer of " + std::to_string(b.size()) + " elements");
  }

  bool deps_done(const RankSim& rs, std::uint32_t i) const {
    const Step& s = rs.plan->steps[i];
    for (std::uint32_t d = 0; d < s.dep_count; ++d)
      if (rs.state[rs.plan->deps[s.dep_begin + d]] != kDone) return false;
    return true;
  }

  void lock_read(RankSim& rs, std::uint32_t i, const Region& r) {
    auto& l = rs.lock[rs.slot(r.buf)];
    for (std::uint64_t e = r.offset; e < r.offset + r.count; ++e) {
      if (l[e].writer) fail(rs, i, "reads element " + std::to_string(e) + " while another step writes it (race)");
      ++l[e].readers;
    }
  }
  void lock_write(RankSim& rs, std::uint32_t i, const Region& r) {
    auto& l = rs.lock[rs.slot(r.buf)];
    for (std::uint64_t e = r.offset; e < r.offset + r.count; ++e) {
      if (l[e].writer || l[e].readers)
        fail(rs, i, "writes element " + std::to_string(e) + " while another step uses it (race)");
      l[e].writer = true;
    }
  }
  void unlock_read(RankSim& rs, const Region& r) {
    auto& l = rs.lock[rs.slot(r.buf)];
    for (std::uint64_t e = r.offset; e < r.offset + r.count; ++e) --l[e].readers;
  }
  void unlock_write(RankSim& rs, const Region& r) {
    auto& l = rs.lock[rs.slot(r.buf)];
    for (std::uint64_t e = r.offset; e < r.offset + r.count; ++e) l[e].writer = false;
  }

  void finalize(RankSim& rs, std::uint32_t i, const Region& r) {
    auto& b = rs.buf[rs.slot(r.buf)];
    for (std::uint64_t e = r.offset; e < r.offset + r.count; ++e) {
      if (!avg) fail(rs, i, "finalizes although the op needs no finishing step");
      if (b[e].finalized) fail(rs, i, "finalizes element " + std::to_string(e) + " twice");
      if (b[e].mask != full) fail(rs, i, "finalizes element " + std::to_string(e) + " before all ranks contributed");
      b[e].finalized = true;
    }
  }

  std::vector<Elem> read(RankSim& rs, std::uint32_t i, const Region& r) {
    const auto& b = rs.buf[rs.slot(r.buf)];
    std::vector<Elem> out(b.begin() + static_cast<std::ptrdiff_t>(r.offset),
                          b.begin() + static_cast<std::ptrdiff_t>(r.offset + r.count));
    for (std::uint64_t e = 0; e < out.size(); ++e)
      if (out[e].mask == 0) fail(rs, i, "reads undefined element " + std::to_string(r.offset + e));
    return out;
  }

  // Post step i of rank rs (its queue head, dependencies met).
  void post(RankSim& rs, std::uint32_t i) {
    const Step& s = rs.plan->steps[i];
    switch (s.kind) {
      case StepKind::send:
        check_bounds(rs, i, s.src);
        lock_read(rs, i, s.src);
        rs.state[i] = kPosted;
        break;
      case StepKind::recv:
        check_bounds(rs, i, s.dst);
        lock_write(rs, i, s.dst);
        rs.state[i] = kPosted;
        break;
      case StepKind::recv_reduce:
        check_bounds(rs, i, s.src);
        check_bounds(rs, i, s.dst);
        if (s.src.count != s.dst.count) fail(rs, i, "src and dst sizes differ");
        lock_write(rs, i, s.dst);
        {  // src may be dst itself (in-place): only other writers conflict
          auto& l = rs.lock[rs.slot(s.src.buf)];
          const bool same = rs.slot(s.src.buf) == rs.slot(s.dst.buf) && s.src.offset == s.dst.offset;
          for (std::uint64_t e = s.src.offset; e < s.src.offset + s.src.count; ++e)
            if (l[e].writer && !same) fail(rs, i, "reads element " + std::to_string(e) + " while another step writes it (race)");
        }
        rs.state[i] = kPosted;
        break;
      case StepKind::reduce: {
        check_bounds(rs, i, s.src);
        check_bounds(rs, i, s.src2);
        check_bounds(rs, i, s.dst);
        if (s.src.count != s.dst.count || s.src2.count != s.dst.count) fail(rs, i, "reduce with operands of different sizes");
        auto a = read(rs, i, s.src);
        auto b = read(rs, i, s.src2);
        lock_write(rs, i, s.dst);
        unlock_write(rs, s.dst);
        auto& d = rs.buf[rs.slot(s.dst.buf)];
        for (std::uint64_t e = 0; e < s.dst.count; ++e) {
          if (a[e].finalized || b[e].finalized) fail(rs, i, "reduces an element that was already finalized");
          if (a[e].mask & b[e].mask) fail(rs, i, "counts a contribution twice at element " + std::to_string(s.dst.offset + e));
          d[s.dst.offset + e] = Elem{a[e].mask | b[e].mask, false};
        }
        if (s.finalize) finalize(rs, i, s.dst);
        complete(rs, i);
        break;
      }
      case StepKind::copy: {
        check_bounds(rs, i, s.src);
        check_bounds(rs, i, s.dst);
        if (s.src.count != s.dst.count) fail(rs, i, "copy with src and dst of different sizes");
        auto data = read(rs, i, s.src);
        lock_write(rs, i, s.dst);  // checks nobody else uses dst
        unlock_write(rs, s.dst);
        auto& b = rs.buf[rs.slot(s.dst.buf)];
        std::copy(data.begin(), data.end(), b.begin() + static_cast<std::ptrdiff_t>(s.dst.offset));
        if (s.finalize) finalize(rs, i, s.dst);
        complete(rs, i);
        break;
      }
    }
  }

  void complete(RankSim& rs, std::uint32_t i) {
    rs.state[i] = kDone;
    ++rs.done;
  }

  void complete_send(RankSim& rs, std::uint32_t i) {
    const Step& s = rs.plan->steps[i];
    auto data = read(rs, i, s.src);
    unlock_read(rs, s.src);
    result.messages++;
    result.bytes += data.size();
    channels[{rs.rank, s.peer}].push_back(std::move(data));
    complete(rs, i);
  }

  void complete_recv(RankSim& rs, std::uint32_t i) {
    const Step& s = rs.plan->steps[i];
    auto& q = channels[{s.peer, rs.rank}];
    std::vector<Elem> msg = std::move(q.front());
    q.pop_front();
    if (msg.size() != s.dst.count)
      fail(rs, i, "expects " + std::to_string(s.dst.count) + " elements from rank " + std::to_string(s.peer) +
                      " but the matching message has " + std::to_string(msg.size()));
    auto& dst = rs.buf[rs.slot(s.dst.buf)];
    if (s.kind == StepKind::recv) {
      std::copy(msg.begin(), msg.end(), dst.begin() + static_cast<std::ptrdiff_t>(s.dst.offset));
    } else {
      const auto& src = rs.buf[rs.slot(s.src.buf)];
      for (std::uint64_t e = 0; e < s.dst.count; ++e) {
        const Elem a = src[s.src.offset + e], m = msg[e];
        if (a.mask == 0) fail(rs, i, "reduces undefined element " + std::to_string(s.src.offset + e));
        if (a.finalized || m.finalized) fail(rs, i, "reduces an element that was already finalized");
        if (a.mask & m.mask)
          fail(rs, i, "counts a contribution twice at element " + std::to_string(s.dst.offset + e));
        dst[s.dst.offset + e] = Elem{a.mask | m.mask, false};
      }
    }
    unlock_write(rs, s.dst);
    if (s.finalize) finalize(rs, i, s.dst);
    complete(rs, i);
  }
};

}  // namespace

VerifyResult verify_plans(const PlanRequest& base, bool in_place, std::uint64_t seed,
                          const PlanBuilder& builder) {
  Sim sim;
  sim.world = base.world;
  sim.avg = base.op == ReduceOp::avg;
  if (base.world < 1 || base.world > 64) {
    sim.result.error = "the verifier handles worlds of 1..64 ranks";
    return sim.result;
  }
  sim.full = base.world == 64 ? ~0ull : ((1ull << base.world) - 1);
  try {
    sim.ranks.resize(static_cast<std::size_t>(base.world));
    for (int r = 0; r < base.world; ++r) {
      RankSim& rs = sim.ranks[static_cast<std::size_t>(r)];
      PlanRequest req = base;
      req.rank = r;
      rs.rank = r;
      rs.in_place = in_place;
      rs.plan = builder(req);
      rs.buf[0].assign(base.count, Elem{1ull << r, false});
      rs.buf[1].assign(base.count, Elem{});
      if (in_place) rs.buf[1] = rs.buf[0];
      rs.buf[2].assign(rs.plan->scratch_count, Elem{});
      for (int b = 0; b < 3; ++b) rs.lock[b].assign(rs.buf[b].size(), Lock{});
      rs.state.assign(rs.plan->steps.size(), kWaiting);
      rs.sendq.resize(static_cast<std::size_t>(base.world));
      rs.recvq.resize(static_cast<std::size_t>(base.world));
      rs.send_head.assign(static_cast<std::size_t>(base.world), 0);
      rs.recv_head.assign(static_cast<std::size_t>(base.world), 0);
      for (std::uint32_t i = 0; i < rs.plan->steps.size(); ++i) {
        const Step& s = rs.plan->steps[i];
        for (std::uint32_t d = 0; d < s.dep_count; ++d)
          if (rs.plan->deps[s.dep_begin + d] >= i) sim.fail(rs, i, "depends on a later step");
        if (s.kind == StepKind::copy || s.kind == StepKind::reduce) {
          rs.localq.push_back(i);
          continue;
        }
        if (s.peer < 0 || s.peer >= base.world || s.peer == r) sim.fail(rs, i, "has an invalid peer");
        (s.kind == StepKind::send ? rs.sendq : rs.recvq)[static_cast<std::size_t>(s.peer)].push_back(i);
      }
    }

    std::mt19937_64 rng(seed);
    struct Action { int rank; std::uint32_t step; int kind; };  // 0 post, 1 complete send, 2 complete recv
    std::vector<Action> actions;
    // Posted transfers per (rank, peer), oldest first: messages between a pair are
    // FIFO, so only the oldest posted send can complete and only the oldest posted
    // receive can match the next message.
    std::vector<std::vector<std::deque<std::uint32_t>>> psend(sim.ranks.size()), precv(sim.ranks.size());
    for (auto& rs : sim.ranks) {
      psend[static_cast<std::size_t>(rs.rank)].resize(static_cast<std::size_t>(base.world));
      precv[static_cast<std::size_t>(rs.rank)].resize(static_cast<std::size_t>(base.world));
    }
    for (;;) {
      actions.clear();
      bool all_done = true;
      for (auto& rs : sim.ranks) {
        if (rs.done != rs.plan->steps.size()) all_done = false;
        const auto ri = static_cast<std::size_t>(rs.rank);
        for (int peer : rs.plan->peers) {
          const auto p = static_cast<std::size_t>(peer);
          if (rs.send_head[p] < rs.sendq[p].size() && sim.deps_done(rs, rs.sendq[p][rs.send_head[p]]))
            actions.push_back({rs.rank, rs.sendq[p][rs.send_head[p]], 0});
          if (rs.recv_head[p] < rs.recvq[p].size() && sim.deps_done(rs, rs.recvq[p][rs.recv_head[p]]))
            actions.push_back({rs.rank, rs.recvq[p][rs.recv_head[p]], 0});
          if (!psend[ri][p].empty()) actions.push_back({rs.rank, psend[ri][p].front(), 1});
          if (!precv[ri][p].empty() && !sim.channels[{peer, rs.rank}].empty())
            actions.push_back({rs.rank, precv[ri][p].front(), 2});
        }
        if (rs.local_head < rs.localq.size() && sim.deps_done(rs, rs.localq[rs.local_head]))
          actions.push_back({rs.rank, rs.localq[rs.local_head], 0});
      }
      if (actions.empty()) {
        if (all_done) break;
        std::ostringstream os;
        os << "deadlock: no step can run;";
        for (auto& rs : sim.ranks)
          for (std::uint32_t i = 0; i < rs.plan->steps.size(); ++i)
            if (rs.state[i] != kDone) {
              os << " rank " << rs.rank << " step " << i << (rs.state[i] == kPosted ? " (posted)" : " (waiting)") << ";";
              break;
            }
        throw VerifyFailure{os.str()};
      }
      const Action a = actions[rng() % actions.size()];
      RankSim& rs = sim.ranks[static_cast<std::size_t>(a.rank)];
      const auto ri = static_cast<std::size_t>(a.rank);
      const Step& s = rs.plan->steps[a.step];
      const auto p = static_cast<std::size_t>(s.peer < 0 ? 0 : s.peer);
      if (a.kind == 0) {
        if (s.kind == StepKind::send) ++rs.send_head[p], psend[ri][p].push_back(a.step);
        else if (s.kind == StepKind::copy || s.kind == StepKind::reduce) ++rs.local_head;
        else ++rs.recv_head[p], precv[ri][p].push_back(a.step);
        sim.post(rs, a.step);
      } else if (a.kind == 1) {
        psend[ri][p].pop_front();
        sim.complete_send(rs, a.step);
      } else {
        precv[ri][p].pop_front();
        sim.complete_recv(rs, a.step);
      }
    }
    for (auto& [key, q] : sim.channels)
      if (!q.empty())
        throw VerifyFailure{std::to_string(q.size()) + " message(s) from rank " + std::to_string(key.first) +
                            " to rank " + std::to_string(key.second) + " were never received"};
    for (auto& rs : sim.ranks) {
      const auto& out = rs.buf[1];
      for (std::uint64_t e = 0; e < out.size(); ++e) {
        if (out[e].mask != sim.full) {
          std::ostringstream os;
          os << "rank " << rs.rank << " output element " << e << " holds contributions 0x" << std::hex
             << out[e].mask << ", expected 0x" << sim.full;
          throw VerifyFailure{os.str()};
        }
        if (out[e].finalized != sim.avg)
          throw VerifyFailure{"rank " + std::to_string(rs.rank) + " output element " + std::to_string(e) +
                              (sim.avg ? " was never finalized" : " was finalized")};
      }
    }
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
