#include "core/compressor.hpp"

#include "base/check.hpp"
#include "base/logging.hpp"
#include "collectives/tuner.hpp"

#include <braid/error.hpp>

#include <cstddef>
#include <cstdlib>
#include <sstream>

namespace braid::core {

using collectives::Collective;
using compression::CodecKind;
using compression::CodecSpec;
using compression::ResidualRole;

Compressor::Compressor(const Config& cfg, Membership member, MeasuredTuner& tuner, PlanCache& plans, Poster& poster)
    : cfg_(cfg), member_(std::move(member)), tuner_(tuner), plans_(plans), poster_(poster) {}

const std::vector<compression::CodecRates>& Compressor::codec_rates() {
  std::lock_guard<std::mutex> lock(rates_mu_);
  if (!rates_.empty()) return rates_;
  // Every rank must resolve `auto` alike: rank 0 times the codec kernels once and
  // publishes the rates; the others use its figures.
  const std::string key = "codec_rates";
  std::string text;
  if (member_.rank == 0) {
    std::ostringstream os;
    os << std::hexfloat;
    for (const auto& r : compression::measure_codec_rates())
      os << compression::name(r.spec) << ' ' << r.encode_Bps << ' ' << r.decode_Bps << '\n';
    text = os.str();
    member_.store->set(key, text);
  } else {
    text = member_.store->get(key, member_.timeout);
  }
  std::istringstream in(text);
  std::string codec;
  std::string enc, dec;
  while (in >> codec >> enc >> dec) {
    compression::CodecRates r;
    r.spec = compression::parse_codec(codec);
    r.encode_Bps = std::strtod(enc.c_str(), nullptr);
    r.decode_Bps = std::strtod(dec.c_str(), nullptr);
    rates_.push_back(r);
  }
  return rates_;
}

CodecSpec Compressor::resolve_codec(const AllreduceOptions& options, std::size_t count, DataType dtype,
                                    ReduceOp op) {
  const std::string& codec_name = options.codec.empty() ? cfg_.codec : options.codec;
  CodecSpec spec = compression::parse_codec(codec_name);
  if (spec.kind != CodecKind::automatic) return spec;
  // auto compresses only what it can (f32 sum/avg across ranks), and only between
  // hosts: inside a host the "link" is memory (shared memory or loopback copies), and
  // the host codec passes cost more memory traffic than the bytes they save. Across
  // hosts, the model of docs/codecs.md: the slowest link's latency and bandwidth against
  // the codecs' measured rates.
  if (dtype != DataType::f32 || (op != ReduceOp::sum && op != ReduceOp::avg) || member_.size == 1 || count == 0) return {};
  if (auto_one_host_.load(std::memory_order_relaxed) == 1) return {};
  collectives::Tuner& t = tuner_.tuner_ref();
  const auto& topo = t.topology();
  if (topo.num_hosts() <= 1) {
    auto_one_host_.store(1, std::memory_order_relaxed);
    BRAID_LOG(info, "codec auto: all " << member_.size << " ranks on one host -> none (inside a host the codec passes cost "
                                          "more memory traffic than the bytes they save)");
    return {};
  }
  const collectives::LinkClass link = topo.inter;
  const compression::LinkModel lm{1.0 / t.model()[link].beta, t.model()[link].alpha};
  const CodecSpec chosen = compression::choose_auto(codec_rates(), count, member_.size, lm, cfg_.codec_max_error);
  if (base::log_enabled(base::LogLevel::info)) {
    std::lock_guard<std::mutex> lock(rates_mu_);
    const auto bucket = collectives::Tuner::size_bucket(static_cast<double>(count) * 4);
    if (logged_auto_.insert(bucket).second)
      BRAID_LOG(info, "codec auto: allreduce of " << count << " x f32 on " << member_.size << " ranks over "
                                                 << collectives::to_string(link) << " (" << lm.Bps / 1e9 << " GB/s, "
                                                 << lm.alpha_s * 1e6 << " us in the cost model), error budget "
                                                 << cfg_.codec_max_error << " -> " << compression::name(chosen));
  }
  return chosen;
}

Work Compressor::allreduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                           const CodecSpec& spec, const AllreduceOptions& options) {
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

  collectives::PlanRequest req = poster_.request(Collective::allreduce, count, sizeof(float), op);
  req.algorithm = Algorithm::automatic;  // the codec's own
  req.codec = spec;
  req.feedback = !options.ef_key.empty();
  // Several ranks per host on several hosts: uncompressed inside a host, compressed
  // between hosts (the builder decides from the host map).
  if (member_.size > 1) req.host_of = member_.topology->host_of();
  auto plan = plans_.plan_for(req);
  float* residual[2] = {nullptr, nullptr};
  if (!options.ef_key.empty()) {
    // Creates (or checks the count of) the residuals now, so that a mismatch is the
    // caller's error and not a failure in the middle of the collective.
    residual[0] = error_feedback_.residual(options.ef_key, ResidualRole::worker, plan->feedback_count[0]);
    if (spec.kind != CodecKind::topk)
      residual[1] = error_feedback_.residual(options.ef_key, ResidualRole::owner, plan->feedback_count[1]);
  }
  const std::uint64_t step = error_feedback_.next_step(options.ef_key);
  Posting p;
  p.plan = std::move(plan);
  p.in = send;
  p.out = recv;
  p.dtype = DataType::f32;
  p.op = op;
  p.timeout = options.timeout;
  p.what = what.c_str();
  p.feedback[0] = residual[0];
  p.feedback[1] = residual[1];
  p.codec_step = step;
  return poster_.post(std::move(p));
}

}  // namespace braid::core
