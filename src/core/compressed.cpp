// Compressed all-reduce (DESIGN.md §6, docs/codecs.md "Compressed all-reduce").
//
// The algorithm is the one compression/reference.cpp computes in one process; here it
// is five operations queued back to back on the communicator's engine, so it is as
// asynchronous and as ordered as any collective:
//
//   1. task   encode: every shard of this rank's bucket (x + worker residual) -> payloads
//   2. plan   all-to-all of the payloads (bytes): rank s receives every rank's shard s
//   3. task   owner: decode and sum shard s in rank order (f32), /W for avg, encode the
//             sum once (+ owner residual) into this rank's slot of the gather buffer
//   4. plan   all-gather (in place) of the reduced payloads
//   5. task   decode every reduced payload into the output
//
// topk uses a sparse all-gather instead: encode the whole bucket, all-gather, and every
// rank sums the W sparse payloads in rank order. Every rank, the owner included, decodes
// the same bytes in the same order, so outputs are bitwise identical across ranks.
// Payloads of different shards differ in size by at most a block; each is sent in a
// slot of the largest size so that one all-to-all and one all-gather carry them.
#include "base/check.hpp"
#include "core/communicator_impl.hpp"
#include "base/logging.hpp"
#include "compression/reference.hpp"
#include "compression/choose.hpp"

#include <braid/error.hpp>

#include <algorithm>
#include <cstring>
#include <iomanip>
#include <sstream>

namespace braid {

using collectives::Collective;
using compression::CodecKind;
using compression::CodecSpec;
using compression::ResidualRole;

/// Everything one compressed all-reduce needs until its last task has run. Kept in a
/// small per-communicator pool and reused once its operations are gone: the payload
/// buffers are then neither allocated nor page-faulted in again on every call.
struct CompressedState {
  CodecSpec spec;
  int rank = 0;
  int world = 1;
  std::size_t count = 0;
  bool average = false;
  std::uint64_t step = 0;
  const float* in = nullptr;
  float* out = nullptr;
  float* worker_residual = nullptr;  // whole bucket, or null
  float* owner_residual = nullptr;   // this rank's shard, or null
  std::size_t slot = 0;              // bytes per payload slot
  std::size_t piece = 0, pieces = 1; // pipelining: elements per piece of a shard, pieces per shard
  std::size_t sub = 0;               // elements per sub-payload of a piece (a multiple of the block)
  std::size_t sub_bytes = 0;         // encoded bytes of a whole sub-payload
  std::vector<std::uint8_t> sendbuf, recvbuf, gathered;
  std::vector<float> acc;
};

namespace {

// Pipelining of the two-phase algorithm: about kPieces pieces per shard, none smaller
// than kMinPiece elements (so that per-operation costs stay small against transfers).
constexpr std::size_t kPieces = 16;
constexpr std::size_t kMinPiece = 64 * 1024;
constexpr std::size_t kPoolSize = 4;  // states kept for reuse (in flight at once, typically 1)
// A piece's payload is a run of sub-payloads of kSub elements (the last may be shorter),
// so that the owner decodes, sums and re-encodes one cache-sized run at a time (its
// accumulator stays in L1/L2) instead of making W + 2 passes over a whole piece.
constexpr std::size_t kSub = 8 * 1024;

}  // namespace

Work Communicator::Impl::post_task(std::function<void()> task, std::string what, std::shared_ptr<void> keepalive,
                                   std::vector<std::shared_ptr<detail::WorkState>> after, bool concurrent) {
  BRAID_CHECK(!engine->failed(), Aborted,
              what << " on rank " << rank << ": the communicator has failed earlier: " << engine->reason());
  core::Operation o;
  o.seq = next_seq++;
  o.task = std::move(task);
  o.after = std::move(after);
  o.concurrent = concurrent;
  o.timeout = timeout;
  o.work = std::make_shared<detail::WorkState>();
  o.keepalive = std::move(keepalive);
  o.name = what + " #" + std::to_string(o.seq) + " on rank " + std::to_string(rank) + "/" + std::to_string(size);
  Work w(o.work);
  engine->submit(std::move(o));
  return w;
}

const std::vector<compression::CodecRates>& Communicator::Impl::codec_rates() {
  std::lock_guard<std::mutex> lock(codec_rates_mu);
  if (!rates.empty()) return rates;
  // Every rank must resolve `auto` alike: rank 0 times the codec kernels once and
  // publishes the rates; the others use its figures.
  const std::string key = "codec_rates";
  std::string text;
  if (rank == 0) {
    std::ostringstream os;
    os << std::hexfloat;
    for (const auto& r : compression::measure_codec_rates())
      os << compression::name(r.spec) << ' ' << r.encode_Bps << ' ' << r.decode_Bps << '\n';
    text = os.str();
    store->set(key, text);
  } else {
    text = store->get(key, timeout);
  }
  std::istringstream in(text);
  std::string name_;
  std::string enc, dec;
  while (in >> name_ >> enc >> dec) {
    compression::CodecRates r;
    r.spec = compression::parse_codec(name_);
    r.encode_Bps = std::strtod(enc.c_str(), nullptr);
    r.decode_Bps = std::strtod(dec.c_str(), nullptr);
    rates.push_back(r);
  }
  return rates;
}

CodecSpec Communicator::Impl::resolve_codec(const AllreduceOptions& options, std::size_t count, DataType dtype,
                                            ReduceOp op) {
  const std::string& codec_name = options.codec.empty() ? cfg.codec : options.codec;
  CodecSpec spec = compression::parse_codec(codec_name);
  if (spec.kind != CodecKind::automatic) return spec;
  // auto compresses only what it can (f32 sum/avg across ranks), and only between
  // hosts: inside a host the "link" is memory (shared memory or loopback copies), and
  // the host codec passes cost more memory traffic than the bytes they save. Across
  // hosts, the model of docs/codecs.md: the slowest link's latency and bandwidth against
  // the codecs' measured rates.
  if (dtype != DataType::f32 || (op != ReduceOp::sum && op != ReduceOp::avg) || size == 1 || count == 0) return {};
  if (auto_one_host.load(std::memory_order_relaxed) == 1) return {};
  collectives::Tuner& t = tuner_ref();
  const auto& topo = t.topology();
  if (topo.num_hosts() <= 1) {
    auto_one_host.store(1, std::memory_order_relaxed);
    BRAID_LOG(info, "codec auto: all " << size << " ranks on one host -> none (inside a host the codec passes cost "
                                          "more memory traffic than the bytes they save)");
    return {};
  }
  const collectives::LinkClass link = topo.inter;
  const compression::LinkModel lm{1.0 / t.model()[link].beta, t.model()[link].alpha};
  const CodecSpec chosen = compression::choose_auto(codec_rates(), count, size, lm, cfg.codec_max_error);
  if (base::log_enabled(base::LogLevel::info)) {
    std::lock_guard<std::mutex> lock(codec_rates_mu);
    const auto bucket = collectives::Tuner::size_bucket(static_cast<double>(count) * 4);
    if (logged_auto.insert(bucket).second)
      BRAID_LOG(info, "codec auto: allreduce of " << count << " x f32 on " << size << " ranks over "
                                                 << collectives::to_string(link) << " (" << lm.Bps / 1e9 << " GB/s, "
                                                 << lm.alpha_s * 1e6 << " us in the cost model), error budget "
                                                 << cfg.codec_max_error << " -> " << compression::name(chosen));
  }
  return chosen;
}

Work Communicator::Impl::compressed_allreduce(const void* send, void* recv, std::size_t count, DataType dtype,
                                              ReduceOp op, const CodecSpec& spec, const AllreduceOptions& options) {
  const std::string codec = compression::name(spec);
  const std::string what = "allreduce[" + codec + "]";
  // Everything is checked here, before any byte moves.
  BRAID_CHECK(dtype == DataType::f32, InvalidUsage,
              what << ": compressed all-reduce takes f32 buffers, got " << to_string(dtype)
                   << "; convert to f32 or pass codec \"none\"");
  BRAID_CHECK(op == ReduceOp::sum || op == ReduceOp::avg, InvalidUsage,
              what << ": compressed all-reduce supports sum and avg, got " << to_string(op)
                   << "; pass codec \"none\" for " << to_string(op));
  BRAID_CHECK(options.algorithm == Algorithm::automatic, InvalidUsage,
              what << ": compressed all-reduce has its own algorithm (two-phase, or sparse all-gather for topk); "
                      "leave AllreduceOptions::algorithm automatic");
  BRAID_CHECK(!compression::requires_error_feedback(spec) || !options.ef_key.empty() || options.allow_biased,
              InvalidUsage,
              what << ": " << codec
                   << " needs error feedback to converge; set AllreduceOptions::ef_key to a key per gradient bucket "
                      "(or allow_biased = true to use it without)");
  BRAID_CHECK(options.timeout.count() >= 0, InvalidUsage, what << ": negative timeout");
  if (count > 0) {
    BRAID_CHECK(send != nullptr && recv != nullptr, InvalidUsage, what << ": null buffer with count " << count);
    const auto* s = static_cast<const std::byte*>(send);
    const auto* r = static_cast<const std::byte*>(recv);
    const std::size_t n = count * sizeof(float);
    BRAID_CHECK(s == r || s + n <= r || r + n <= s, InvalidUsage,
                what << ": send and recv overlap partially; pass the same pointer for in place or disjoint buffers");
  }

  // Several ranks per host on several hosts: uncompressed inside a host (shared
  // memory), compressed between hosts.
  if (spec.kind != CodecKind::topk && count > 0) {
    if (auto h = hierarchy_for_compression()) return hierarchical_compressed(h, send, recv, count, op, spec, options);
  }

  std::shared_ptr<CompressedState> st;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& p : compressed_pool)
      if (p.use_count() == 1) {  // no operation holds it any more
        st = p;
        break;
      }
    if (!st) {
      st = std::make_shared<CompressedState>();
      if (compressed_pool.size() < kPoolSize) compressed_pool.push_back(st);
    }
  }
  st->slot = 0;
  st->worker_residual = st->owner_residual = nullptr;
  st->spec = spec;
  st->rank = rank;
  st->world = size;
  st->count = count;
  st->average = op == ReduceOp::avg;
  st->in = static_cast<const float*>(send);
  st->out = static_cast<float*>(recv);
  const compression::ShardRange mine = compression::shard_range(count, size, rank);
  if (!options.ef_key.empty()) {
    // Creates (or checks the count of) both residuals now, so that a mismatch is the
    // caller's error and not a failure in the middle of the collective.
    st->worker_residual = error_feedback.residual(options.ef_key, ResidualRole::worker, count);
    if (spec.kind != CodecKind::topk)
      st->owner_residual = error_feedback.residual(options.ef_key, ResidualRole::owner, mine.size());
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    st->step = codec_steps[options.ef_key]++;
  }
  auto post_bytes = [&](Collective c, const void* in, void* out, std::size_t bytes, const char* step_name,
                        std::shared_ptr<detail::WorkState>* state = nullptr) {
    collectives::PlanRequest req = request(c, bytes, 1, ReduceOp::sum);
    req.algorithm = Algorithm::automatic;
    if (size > 1) req.host_of = topology->host_of();
    const std::string op_name = what + " " + step_name;
    // Each byte collective has buffers of its own (its piece's slots), and the tasks
    // that fill or read them are ordered by the engine, so consecutive ones may overlap:
    // the all-gather of piece c runs beside the all-to-all of piece c+1, and the links
    // stay busy across the boundary where one ends and the next starts.
    PostHints hints;
    hints.overlap = true;
    return post(plan_for(req), in, out, DataType::u8, ReduceOp::sum, options.timeout, op_name.c_str(), st, state,
                std::move(hints));
  };

  if (spec.kind == CodecKind::topk) {
    st->slot = compression::encoded_bytes(spec, count);
    st->gathered.resize(st->slot * static_cast<std::size_t>(size));
    post_task(
        [st] {
          std::uint8_t* mine_out = st->gathered.data() + st->slot * static_cast<std::size_t>(st->rank);
          if (st->worker_residual)
            compression::encode_add_feedback(st->spec, st->in, st->worker_residual, st->count, mine_out, st->step, 0);
          else
            compression::encode(st->spec, st->in, st->count, mine_out, st->step, 0);
        },
        what + " encode", st);
    std::uint8_t* g = st->gathered.data();
    post_bytes(Collective::allgather, g + st->slot * static_cast<std::size_t>(rank), g, st->slot, "sparse all-gather");
    return post_task(
        [st] {
          std::fill(st->out, st->out + st->count, 0.0f);
          for (int r = 0; r < st->world; ++r)
            compression::decode_accumulate(st->spec, st->gathered.data() + st->slot * static_cast<std::size_t>(r),
                                           st->count, st->out);
          if (st->average)
            for (std::size_t i = 0; i < st->count; ++i) st->out[i] = st->out[i] / static_cast<float>(st->world);
        },
        what + " sum", st);
  }

  // Pipelined in pieces: piece c of shard s is [b_s + c*P, min(b_s + (c+1)*P, e_s)),
  // P a multiple of the block, so the payloads decode to exactly what whole-shard
  // payloads would (blocks start at the shard's start; the RNG is keyed on the global
  // offset). Piece c's stages: E (encode, task), A (all-to-all), O (owner sum and
  // re-encode, task, after A), G (all-gather), D (decode, task, after G). Issued as
  //   E0 A0 | E1 A1 O0 G0 | E2 A2 O1 G1 D0 | ... | O(C-1) G(C-1) D(C-2) | D(C-1)
  // so that every task runs while a transfer is in flight (collectives run one at a
  // time in issue order, tasks beside them).
  std::size_t max_shard = 0;
  for (int s = 0; s < size; ++s) max_shard = std::max(max_shard, compression::shard_range(count, size, s).size());
  const std::size_t unit = static_cast<std::size_t>(std::max(8, spec.block));
  std::size_t piece = std::max<std::size_t>(kMinPiece, (max_shard + kPieces - 1) / kPieces);
  piece = (piece + unit - 1) / unit * unit;
  const std::size_t pieces = std::max<std::size_t>(1, (max_shard + piece - 1) / piece);
  st->piece = piece;
  st->pieces = pieces;
  st->sub = (kSub + unit - 1) / unit * unit;
  st->sub_bytes = compression::encoded_bytes(spec, st->sub);
  // Bytes of the sub-payloads of n elements (whole ones and a shorter last one).
  auto framed_bytes = [st](std::size_t n) {
    return n / st->sub * st->sub_bytes + (n % st->sub ? compression::encoded_bytes(st->spec, n % st->sub) : 0);
  };
  st->slot = framed_bytes(std::min(piece, max_shard));
  const std::size_t per_piece = st->slot * static_cast<std::size_t>(size);
  st->sendbuf.resize(per_piece * pieces);
  st->recvbuf.resize(per_piece * pieces);
  st->gathered.resize(per_piece * pieces);
  st->acc.resize(std::min(st->sub, mine.size()));

  // Elements [begin, end) of piece c of shard s.
  auto piece_of = [](const CompressedState& x, int s, std::size_t c) {
    const auto sr = compression::shard_range(x.count, x.world, s);
    const std::size_t b = std::min(sr.end, sr.begin + c * x.piece);
    return compression::ShardRange{b, std::min(sr.end, b + x.piece)};
  };
  auto payload = [](std::vector<std::uint8_t>& buf, const CompressedState& x, std::size_t c, int s) {
    return buf.data() + (c * static_cast<std::size_t>(x.world) + static_cast<std::size_t>(s)) * x.slot;
  };
  // Sub-payload k of a piece starting at element b holds elements [b + k*sub, ...) at
  // byte k*sub_bytes of the piece's slot; blocks start at every sub-payload's start and
  // the RNG is keyed on global offsets, so the values are those of one whole payload.
  auto encode_piece = [st, piece_of, payload](std::size_t c) {
    const CodecSpec ws = compression::stream_spec(st->spec, st->rank, compression::Phase::worker);
    for (int s = 0; s < st->world; ++s) {
      const auto pr = piece_of(*st, s, c);
      std::uint8_t* dst = payload(st->sendbuf, *st, c, s);
      for (std::size_t b = pr.begin; b < pr.end; b += st->sub, dst += st->sub_bytes) {
        const std::size_t n = std::min(st->sub, pr.end - b);
        if (st->worker_residual)
          compression::encode_add_feedback(ws, st->in + b, st->worker_residual + b, n, dst, st->step, b);
        else
          compression::encode(ws, st->in + b, n, dst, st->step, b);
      }
    }
  };
  auto owner_piece = [st, piece_of, payload](std::size_t c) {
    const auto pr = piece_of(*st, st->rank, c);
    const CodecSpec os = compression::stream_spec(st->spec, st->rank, compression::Phase::owner);
    const auto shard = compression::shard_range(st->count, st->world, st->rank);
    float* acc = st->acc.data();
    for (std::size_t b = pr.begin, at = 0; b < pr.end; b += st->sub, at += st->sub_bytes) {
      const std::size_t n = std::min(st->sub, pr.end - b);
      std::fill(acc, acc + n, 0.0f);
      for (int r = 0; r < st->world; ++r)
        compression::decode_accumulate(st->spec, payload(st->recvbuf, *st, c, r) + at, n, acc);
      if (st->average)
        for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] / static_cast<float>(st->world);
      std::uint8_t* dst = payload(st->gathered, *st, c, st->rank) + at;
      if (st->owner_residual)
        compression::encode_add_feedback(os, acc, st->owner_residual + (b - shard.begin), n, dst, st->step, b);
      else
        compression::encode(os, acc, n, dst, st->step, b);
    }
  };
  auto decode_piece = [st, piece_of, payload](std::size_t c) {
    for (int s = 0; s < st->world; ++s) {
      const auto pr = piece_of(*st, s, c);
      const std::uint8_t* src = payload(st->gathered, *st, c, s);
      for (std::size_t b = pr.begin; b < pr.end; b += st->sub, src += st->sub_bytes)
        compression::decode(st->spec, src, std::min(st->sub, pr.end - b), st->out + b);
    }
  };

  using State = std::shared_ptr<detail::WorkState>;
  std::vector<State> a_done(pieces), g_done(pieces);
  Work last;
  const std::string n_of = " " + std::to_string(pieces);
  for (std::size_t c = 0; c <= pieces + 1; ++c) {
    if (c < pieces) {
      const std::string k = " " + std::to_string(c + 1) + "/" + std::to_string(pieces);
      // The first encode waits for everything issued before (it reads the input);
      // later ones overlap the previous piece's transfers.
      post_task([encode_piece, c] { encode_piece(c); }, what + " encode" + k, st, {}, c > 0);
      post_bytes(Collective::alltoall, payload(st->sendbuf, *st, c, 0), payload(st->recvbuf, *st, c, 0), st->slot,
                 ("all-to-all" + k).c_str(), &a_done[c]);
    }
    if (c >= 1 && c <= pieces) {
      const std::size_t p = c - 1;
      const std::string k = " " + std::to_string(p + 1) + "/" + std::to_string(pieces);
      post_task([owner_piece, p] { owner_piece(p); }, what + " owner sum" + k, st, {a_done[p]}, true);
      std::uint8_t* g = payload(st->gathered, *st, p, 0);
      post_bytes(Collective::allgather, g + st->slot * static_cast<std::size_t>(rank), g, st->slot,
                 ("all-gather" + k).c_str(), &g_done[p]);
    }
    if (c >= 2) {
      const std::size_t p = c - 2;
      const std::string k = " " + std::to_string(p + 1) + "/" + std::to_string(pieces);
      last = post_task([decode_piece, p] { decode_piece(p); }, what + " decode" + k, st, {g_done[p]}, true);
    }
  }
  return last;
}

std::shared_ptr<Communicator::Impl::Hierarchy> Communicator::Impl::hierarchy_for_compression() {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (hierarchy) return *hierarchy;
  }
  std::shared_ptr<Hierarchy> h;
  if (size > 1) {
    const core::Layout& l = topology->layout();
    const int per_host = l.local_size;
    if (l.hosts() > 1 && per_host > 1 && l.uniform()) {
      // Every rank reaches this at the same call (the first compressed all-reduce), so
      // the splits line up; split is collective over the store only.
      h = std::make_shared<Hierarchy>();
      h->local_rank = l.local_rank;
      h->local_size = per_host;
      h->hosts = l.hosts();
      const int my_host = l.host_of[static_cast<std::size_t>(rank)];
      h->local = std::make_unique<Communicator>(split_impl(my_host, rank));
      h->cross = std::make_unique<Communicator>(split_impl(l.local_rank, my_host));
      BRAID_LOG(info, "compressed all-reduce: hierarchical, " << l.hosts() << " hosts x " << per_host
                                                              << " ranks (uncompressed inside a host)");
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  if (!hierarchy) hierarchy = h;
  return *hierarchy;
}

Work Communicator::Impl::hierarchical_compressed(const std::shared_ptr<Hierarchy>& h, const void* send, void* recv,
                                                 std::size_t count, ReduceOp op, const CodecSpec& spec,
                                                 const AllreduceOptions& options) {
  const compression::ShardRange mine = compression::shard_range(count, h->local_size, h->local_rank);
  AllreduceOptions cross_opt;
  cross_opt.codec = compression::name(spec);
  cross_opt.ef_key = options.ef_key;
  cross_opt.allow_biased = options.allow_biased;
  cross_opt.timeout = options.timeout;
  if (!options.ef_key.empty()) {
    // Check the residuals' counts now (the caller's error), as the flat path does.
    Impl& c = *h->cross->impl_;
    c.error_feedback.residual(options.ef_key, ResidualRole::worker, mine.size());
    c.error_feedback.residual(options.ef_key, ResidualRole::owner,
                              compression::shard_range(mine.size(), c.size, c.rank).size());
  }
  const auto* in = static_cast<const float*>(send);
  auto* out = static_cast<float*>(recv);
  const int world = size;
  const bool average = op == ReduceOp::avg;
  const auto call_timeout = options.timeout;
  // One task on this communicator's engine runs the three stages on the two
  // sub-communicators and waits for each: it is ordered with everything else issued
  // here, and nothing else runs beside it (tasks run alone).
  return post_task(
      [h, in, out, count, mine, cross_opt, world, average, call_timeout] {
        AllreduceOptions plain;
        plain.timeout = call_timeout;
        plain.codec = "none";
        h->local->allreduce(in, out, count, DataType::f32, ReduceOp::sum, plain).wait();
        h->cross->allreduce(out + mine.begin, out + mine.begin, mine.size(), DataType::f32, ReduceOp::sum, cross_opt)
            .wait();
        if (average)
          for (std::size_t i = mine.begin; i < mine.end; ++i) out[i] = out[i] / static_cast<float>(world);
        std::vector<Work> works;
        for (int j = 0; j < h->local_size; ++j) {
          const auto sj = compression::shard_range(count, h->local_size, j);
          BroadcastOptions b;
          b.root = j;
          b.timeout = call_timeout;
          works.push_back(h->local->broadcast(out + sj.begin, out + sj.begin, sj.size(), DataType::f32, b));
        }
        for (auto& w : works) w.wait();
      },
      "allreduce[" + compression::name(spec) + "] hierarchical (" + std::to_string(h->hosts) + " hosts x " +
          std::to_string(h->local_size) + ")",
      nullptr);
}

// --- error feedback: public API ---

void Communicator::save_error_feedback(std::ostream& os) const { impl_->error_feedback.save(os); }
void Communicator::restore_error_feedback(std::istream& is) { impl_->error_feedback.restore(is); }
void Communicator::save_error_feedback(std::ostream& os, const std::string& key_prefix) const {
  impl_->error_feedback.save(os, key_prefix);
}
void Communicator::restore_error_feedback(std::istream& is, const std::string& key_prefix) {
  impl_->error_feedback.restore(is, key_prefix);
}
void Communicator::reset_error_feedback(const std::string& ef_key) {
  if (ef_key.empty())
    impl_->error_feedback.reset_all();
  else
    impl_->error_feedback.reset(ef_key);
}
std::size_t Communicator::error_feedback_bytes() const { return impl_->error_feedback.bytes(); }

}  // namespace braid
