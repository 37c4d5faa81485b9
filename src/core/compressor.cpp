#include "core/compressor.hpp"

#include "base/check.hpp"
#include "base/logging.hpp"
#include "base/text.hpp"
#include "collectives/tuner.hpp"
#include "gpu/runtime.hpp"
#include "kernels/host/codec_kernels.hpp"

#include <braid/error.hpp>

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <sstream>
#include <utility>

namespace braid::core {

using collectives::Collective;
using compression::CodecKind;
using compression::CodecSpec;
using compression::ResidualRole;

Compressor::Compressor(const Config& cfg, Membership member, MeasuredTuner& tuner, PlanCache& plans, Poster& poster)
    : cfg_(cfg), member_(std::move(member)), tuner_(tuner), plans_(plans), poster_(poster) {
  // BRAID_CODEC, parsed once: every all-reduce without a codec of its own resolves it (a
  // parse per call was 5 % of a 4 KiB all-reduce). One that does not parse stays unparsed
  // here, and each call reports it as before.
  try {
    configured_ = compression::parse_codec(cfg_.codec);
  } catch (const std::exception&) {
    configured_.reset();
  }
}

Compressor::~Compressor() {
  std::lock_guard<std::mutex> lock(feedback_mu_);
  free_device_residuals({});
}

namespace {

/// What the codecs take: f32, and bf16/f16 through an f32 copy (docs/codecs.md).
bool codec_takes(DataType t) noexcept { return t == DataType::f32 || t == DataType::bf16 || t == DataType::f16; }
bool under(const std::string& key, const std::string& prefix) { return key.compare(0, prefix.size(), prefix) == 0; }
}  // namespace

float* Compressor::device_residual(const std::string& key, ResidualRole role, std::size_t count, int device,
                                   const std::string& what) {
  const auto found = device_residuals_.find({key, role});
  if (found != device_residuals_.end()) {
    const DeviceResidual& slot = found->second;
    BRAID_CHECK(slot.count == count, InvalidUsage,
                what << ": error-feedback key '" << key << "' holds " << slot.count << " residual values, but this call needs "
                     << count << "; use one key per gradient bucket (or reset_error_feedback(\"" << key << "\") first)");
    BRAID_CHECK(slot.device == device, InvalidUsage,
                what << ": error-feedback key '" << key << "' holds its residuals on GPU " << slot.device
                     << ", but this call's buffers are on GPU " << device);
    return slot.p;
  }
  // Made from what the host store holds for the key (zero on first use, or a restored
  // checkpoint): the store checks the count and says what is wrong.
  std::vector<float> zero;
  const float* from = nullptr;
  if (error_feedback_.contains(key, role)) {
    from = error_feedback_.residual(key, role, count);
  } else {
    zero.assign(count, 0.0f);
    from = zero.data();
  }
  gpu::Runtime& rt = gpu_runtime();
  gpu::RelaxedCapture relaxed(rt);  // braid's own allocation: never breaks an application's capture
  const std::size_t bytes = count * sizeof(float);
  auto* p = static_cast<float*>(rt.alloc_device(bytes, device));
  try {
    rt.copy(p, from, bytes);
  } catch (...) {
    rt.free_device(p);
    throw;
  }
  DeviceResidual& slot = device_residuals_[{key, role}];
  slot.p = p;
  slot.count = count;
  slot.device = device;
  return p;
}

void Compressor::free_device_residuals(const std::string& key) {
  if (device_residuals_.empty()) return;
  gpu::Runtime* rt = &gpu_runtime();
  gpu::RelaxedCapture relaxed(*rt);
  for (auto it = device_residuals_.begin(); it != device_residuals_.end();) {
    if (!key.empty() && it->first.first != key) {
      ++it;
      continue;
    }
    if (it->second.p) rt->free_device(it->second.p);
    it = device_residuals_.erase(it);
  }
}

void Compressor::download_device_residuals(const std::string& prefix, std::vector<std::string>* keys) {
  for (const auto& [k, r] : device_residuals_) {
    if (!under(k.first, prefix)) continue;
    if (keys->empty() || keys->back() != k.first) keys->push_back(k.first);
    float* host = error_feedback_.residual(k.first, k.second, r.count);
    gpu::RelaxedCapture relaxed(gpu_runtime());
    gpu_runtime().copy(host, r.p, r.count * sizeof(float));
  }
}

void Compressor::save_feedback(std::ostream& os, const std::string& prefix) {
  std::lock_guard<std::mutex> lock(feedback_mu_);
  // The device residuals go through the host store for the checkpoint, and leave it again.
  std::vector<std::string> staged;
  try {
    download_device_residuals(prefix, &staged);
    error_feedback_.save(os, prefix);
  } catch (...) {
    for (const auto& k : staged) error_feedback_.reset(k);
    throw;
  }
  for (const auto& k : staged) error_feedback_.reset(k);
}

void Compressor::restore_feedback(std::istream& is, const std::string& prefix) {
  std::lock_guard<std::mutex> lock(feedback_mu_);
  error_feedback_.restore(is, prefix);  // throws with the store unchanged
  // The restored values are the host store's now: the next call under each key takes
  // them to wherever it runs.
  std::vector<std::string> gone;
  for (const auto& [k, r] : device_residuals_)
    if (under(k.first, prefix) && (gone.empty() || gone.back() != k.first)) gone.push_back(k.first);
  for (const auto& k : gone) free_device_residuals(k);
  for (auto it = on_device_.begin(); it != on_device_.end();)
    it = under(it->first, prefix) ? on_device_.erase(it) : std::next(it);
}

void Compressor::reset_feedback(const std::string& key) {
  std::lock_guard<std::mutex> lock(feedback_mu_);
  if (key.empty()) {
    error_feedback_.reset_all();
    free_device_residuals({});
    on_device_.clear();
    return;
  }
  error_feedback_.reset(key);
  free_device_residuals(key);
  on_device_.erase(key);
}

void Compressor::adopt_feedback(Compressor& parent) {
  std::stringstream residuals;
  parent.save_feedback(residuals, {});
  restore_feedback(residuals, {});
  std::lock_guard<std::mutex> lock(feedback_mu_);
  error_feedback_.reset_role(compression::ResidualRole::owner);
}

std::size_t Compressor::feedback_bytes() const {
  std::lock_guard<std::mutex> lock(feedback_mu_);
  std::size_t n = error_feedback_.bytes();
  for (const auto& [k, r] : device_residuals_) n += r.count * sizeof(float);
  return n;
}

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
  std::string why;
  if (!parse_codec_rates(text, &rates_, &why))
    throw Error(ErrorCode::Network, "rank " + std::to_string(member_.rank) +
                                        ": rank 0's codec rates in the store (key 'codec_rates') are malformed: " +
                                        why + "; is another program using this store?");
  return rates_;
}

LinkFigures Compressor::link_between_hosts() {
  std::lock_guard<std::mutex> lock(link_mu_);
  if (link_) return *link_;
  const auto& topo = tuner_.tuner_ref().topology();
  LinkFigures f;
  const int partner = probe_partner(topo);
  if (partner < 0) {  // one host: nothing between hosts to measure
    link_ = f;
    return f;
  }
  const std::string key = "link_between_hosts";
  if (member_.rank == 0 || member_.rank == partner) {
    f.a = 0;
    f.b = partner;
    try {
      f.link = run_link_probe(poster_, member_.rank, member_.rank == 0 ? partner : 0);
    } catch (const Error& e) {
      // The others wait for rank 0's figures: tell them why there are none, rather than
      // leave them to their timeout.
      if (member_.rank == 0) member_.store->set(key, std::string("failed: ") + e.what());
      throw;
    }
  }
  // Every rank prices with rank 0's figures (the partner's own differ by the noise).
  if (member_.rank == 0) {
    member_.store->set(key, format_link_figures(f));
  } else {
    std::string text;
    try {
      text = member_.store->get(key, member_.timeout);
    } catch (const Error& e) {
      throw Error(e.code(), "rank " + std::to_string(member_.rank) + ": rank 0 did not publish the link between hosts "
                            "it measures with rank " + std::to_string(partner) + " (codec auto's first call across "
                            "hosts, or link_between_hosts()): " + e.what());
    }
    if (text.rfind("failed: ", 0) == 0)
      throw Error(ErrorCode::RemoteError, "rank " + std::to_string(member_.rank) +
                                              ": rank 0 could not measure the link between hosts with rank " +
                                              std::to_string(partner) + ": " + text.substr(8, 512));
    std::string why;
    if (!parse_link_figures(text, member_.size, &f, &why))
      throw Error(ErrorCode::Network, "rank " + std::to_string(member_.rank) +
                                          ": rank 0's link figures in the store (key '" + key + "') are malformed: " +
                                          why + "; is another program using this store?");
  }
  BRAID_LOG(info, "link between hosts (rank " << f.a << " <-> rank " << f.b << ", measured): latency "
                                              << f.link.alpha_s * 1e6 << " us, bandwidth " << f.link.Bps / 1e9
                                              << " GB/s");
  link_ = f;
  return f;
}

void Compressor::inherit_link(const Compressor& parent) {
  std::optional<LinkFigures> got;
  {
    std::lock_guard<std::mutex> lock(parent.link_mu_);
    got = parent.link_;
  }
  // A pair the child does not have (ranks renumbered) still measured the same links.
  std::lock_guard<std::mutex> lock(link_mu_);
  if (got && !link_) link_ = got;
}

bool parse_codec_rates(const std::string& text, std::vector<compression::CodecRates>* out, std::string* why) {
  std::vector<compression::CodecRates> rates;
  std::istringstream in(text);
  std::string codec, enc, dec;
  while (in >> codec >> enc >> dec) {
    compression::CodecRates r;
    try {
      r.spec = compression::parse_codec(codec);
    } catch (const std::exception& e) {
      *why = "codec " + base::quote(codec.substr(0, 64)) + ": " + e.what();
      return false;
    }
    // A rate is a positive finite number of bytes per second.
    const bool read = base::parse_double(enc, &r.encode_Bps) && base::parse_double(dec, &r.decode_Bps);
    if (!read || !(r.encode_Bps > 0) || !(r.decode_Bps > 0) || !std::isfinite(r.encode_Bps) ||
        !std::isfinite(r.decode_Bps)) {
      *why = "the rates of " + base::quote(codec.substr(0, 64)) + " are not positive finite numbers";
      return false;
    }
    rates.push_back(r);
    if (rates.size() > 256) {
      *why = "more than 256 codecs";
      return false;
    }
  }
  if (!in.eof() || rates.empty()) {
    *why = rates.empty() ? "no codec" : "a line is not 'codec encode decode'";
    return false;
  }
  *out = std::move(rates);
  return true;
}

CodecSpec Compressor::resolve_codec(const AllreduceOptions& options, std::size_t count, DataType dtype,
                                    ReduceOp op) {
  const CodecSpec spec = options.codec.empty() && configured_
                             ? *configured_
                             : compression::parse_codec(options.codec.empty() ? cfg_.codec : options.codec);
  if (spec.kind != CodecKind::automatic) {
    // Checked here, when the call is made, so that a device call on the staged path (whose
    // Compressor::allreduce runs once the stream has staged the input) is refused too
    // before any byte moves.
    BRAID_CHECK(spec.kind == CodecKind::none || codec_takes(dtype), InvalidUsage,
                "allreduce[" << compression::name(spec) << "]: compressed all-reduce takes f32, bf16 or f16 buffers, got "
                             << to_string(dtype) << "; pass codec \"none\" for " << to_string(dtype));
    return spec;
  }
  // auto compresses only what it can (f32, bf16 and f16 sum/avg across ranks), and only
  // between hosts: inside a host the "link" is memory (shared memory or loopback copies),
  // and the host codec passes cost more memory traffic than the bytes they save. Across
  // hosts, the model of docs/codecs.md: the slowest link's latency and bandwidth against
  // the codecs' measured rates (16-bit buffers priced with their conversions to f32).
  if (!codec_takes(dtype) || (op != ReduceOp::sum && op != ReduceOp::avg) || member_.size == 1 || count == 0) return {};
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
  compression::LinkModel lm{1.0 / t.model()[link].beta, t.model()[link].alpha};
  bool measured = false;
  if (cfg_.link_probe) {
    const LinkFigures f = link_between_hosts();
    if (f.a >= 0) {
      lm = f.link;
      measured = true;
    }
  }
  const std::size_t elem = dtype_size(dtype);
  const CodecSpec chosen =
      compression::choose_auto(codec_rates(), count, member_.size, lm, cfg_.codec_max_error, 0.10, elem);
  if (base::log_enabled(base::LogLevel::info)) {
    std::lock_guard<std::mutex> lock(rates_mu_);
    // One line per size class and element type.
    const auto bucket = collectives::Tuner::size_bucket(static_cast<double>(count * elem)) * 8 + elem;
    if (logged_auto_.insert(bucket).second)
      BRAID_LOG(info, "codec auto: allreduce of " << count << " x " << to_string(dtype) << " on " << member_.size << " ranks over "
                                                 << collectives::to_string(link) << " (" << lm.Bps / 1e9 << " GB/s, "
                                                 << lm.alpha_s * 1e6 << " us "
                                                 << (measured ? "measured" : "in the cost model") << "), error budget "
                                                 << cfg_.codec_max_error << " -> " << compression::name(chosen));
  }
  return chosen;
}

Work Compressor::allreduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op,
                           const CodecSpec& spec, const AllreduceOptions& options, int device) {
  const std::string codec = compression::name(spec);
  const std::string what = "allreduce[" + codec + "]";
  // Everything but the dtype (resolve_codec) is checked here, before any byte moves.
  const bool half = dtype == DataType::bf16 || dtype == DataType::f16;
  BRAID_CHECK(codec_takes(dtype), Internal,
              what << ": " << to_string(dtype) << " buffers reached the compressor (resolve_codec refuses them)");
  // bf16/f16 device buffers with a codec are staged by the communicator (they are widened
  // to f32 by host tasks): they never reach here with a device.
  BRAID_CHECK(!half || device < 0, Internal,
              what << ": " << to_string(dtype) << " device buffers with a codec reached the device path unstaged");
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
    const std::size_t n = count * dtype_size(dtype);
    BRAID_CHECK(s == r || s + n <= r || r + n <= s, InvalidUsage,
                what << ": send and recv overlap partially; pass the same pointer for in place or disjoint buffers");
  }
  if (half) {
    // fp32 inside (docs/codecs.md, "bf16 and fp16 buffers"): the input widened (exactly)
    // into a buffer of the library's, the f32 compressed all-reduce in place there, the
    // result rounded to the caller's type (nearest even) into recv. Widening and narrowing
    // are host tasks in issue order, so that on the staged device path they run once the
    // stream has staged the input, and after the all-reduce.
    const auto fmt = dtype == DataType::bf16 ? kernels::HalfFormat::bf16 : kernels::HalfFormat::fp16;
    auto wide = std::make_shared<std::vector<float>>(count);
    const std::string type = std::string(to_string(dtype));
    poster_.post_task(
        [wide, send, count, fmt] {
          if (count > 0) kernels::half_decode(fmt, static_cast<const std::uint8_t*>(send), count, wide->data(), false);
        },
        what + " (" + type + " to f32)", wide);
    post(wide->data(), wide->data(), count, op, spec, options, device, what);
    return poster_.post_task(
        [wide, recv, count, fmt] {
          if (count > 0)
            kernels::half_narrow(fmt, wide->data(), nullptr, count, static_cast<std::uint8_t*>(recv), nullptr);
        },
        what + " (f32 to " + type + ")", wide);
  }
  return post(send, recv, count, op, spec, options, device, what);
}

Work Compressor::post(const void* send, void* recv, std::size_t count, ReduceOp op, const CodecSpec& spec,
                      const AllreduceOptions& options, int device, const std::string& what) {
  collectives::PlanRequest req = poster_.request(Collective::allreduce, count, sizeof(float), op);
  req.algorithm = Algorithm::automatic;  // the codec's own
  req.codec = spec;
  req.feedback = !options.ef_key.empty();
  req.on_device = device >= 0;  // a launch per codec step: the owner works whole pieces
  // Several ranks per host on several hosts: uncompressed inside a host, compressed
  // between hosts (the builder decides from the host map).
  if (member_.size > 1) req.host_of = member_.topology->host_of();
  auto plan = plans_.plan_for(req);
  float* residual[2] = {nullptr, nullptr};
  if (!options.ef_key.empty()) {
    // Creates (or checks the count of) the residuals now, so that a mismatch is the
    // caller's error and not a failure in the middle of the collective.
    const std::string& key = options.ef_key;
    std::lock_guard<std::mutex> lock(feedback_mu_);
    const auto home = on_device_.find(key);
    const bool on_device = device >= 0;
    if (home != on_device_.end() && home->second != on_device)
      throw Error(ErrorCode::InvalidUsage,
                  what + ": error-feedback key '" + key + "' holds its residuals in " +
                      (home->second ? "GPU memory (its calls took device buffers on the device path)"
                                    : "host memory (its calls took host buffers, or ran on the staged device path)") +
                      ", and this call takes " + (on_device ? "device" : "host") +
                      " buffers; keep one memory kind per key, or reset_error_feedback(\"" + key + "\") first");
    if (on_device) {
      try {
        residual[0] = device_residual(key, ResidualRole::worker, plan->feedback_count[0], device, what);
        if (spec.kind != CodecKind::topk)
          residual[1] = device_residual(key, ResidualRole::owner, plan->feedback_count[1], device, what);
      } catch (...) {
        // A new key stays as it was (host values untouched, nothing on the GPU).
        if (home == on_device_.end()) free_device_residuals(key);
        throw;
      }
      // The values now live on the GPU; the host store keeps only the key's step counter.
      if (home == on_device_.end()) error_feedback_.reset(key);
    } else {
      residual[0] = error_feedback_.residual(key, ResidualRole::worker, plan->feedback_count[0]);
      if (spec.kind != CodecKind::topk)
        residual[1] = error_feedback_.residual(key, ResidualRole::owner, plan->feedback_count[1]);
    }
    on_device_[key] = on_device;
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
