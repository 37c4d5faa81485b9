// Compressed all-reduce (DESIGN.md §6, docs/codecs.md "Compressed all-reduce"): the
// communicator's side. The algorithm is a plan like any other
// (collectives/compressed.cpp builds it, the verifier proves it, the cost model prices
// it, the engine runs its encode and decode steps); here the call is checked, the codec
// resolved (`auto`), the error-feedback residuals found, and the plan posted.
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

Work Communicator::Impl::post_task(std::function<void()> task, std::string what, std::shared_ptr<void> keepalive) {
  BRAID_CHECK(!engine->failed(), Aborted,
              what << " on rank " << rank << ": the communicator has failed earlier: " << engine->reason());
  core::Operation o;
  o.seq = next_seq++;
  o.task = std::move(task);
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
  collectives::Tuner& t = tuner->tuner_ref();
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

  collectives::PlanRequest req = request(Collective::allreduce, count, sizeof(float), op);
  req.algorithm = Algorithm::automatic;  // the codec's own
  req.codec = spec;
  req.feedback = !options.ef_key.empty();
  // Several ranks per host on several hosts: uncompressed inside a host, compressed
  // between hosts (the builder decides from the host map).
  if (size > 1) req.host_of = topology->host_of();
  auto plan = plans.plan_for(req);
  float* residual[2] = {nullptr, nullptr};
  std::uint64_t step = 0;
  if (!options.ef_key.empty()) {
    // Creates (or checks the count of) the residuals now, so that a mismatch is the
    // caller's error and not a failure in the middle of the collective.
    residual[0] = error_feedback.residual(options.ef_key, ResidualRole::worker, plan->feedback_count[0]);
    if (spec.kind != CodecKind::topk)
      residual[1] = error_feedback.residual(options.ef_key, ResidualRole::owner, plan->feedback_count[1]);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    step = codec_steps[options.ef_key]++;
  }
  core::Posting p;
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
  return post(std::move(p));
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
