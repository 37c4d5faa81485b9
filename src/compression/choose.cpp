// Cost model for codec "auto"; see choose.hpp.
#include "compression/choose.hpp"

#include "compression/reference.hpp"

#include <algorithm>
#include <chrono>
#include <random>

namespace braid::compression {

std::vector<CodecSpec> auto_candidates() {
  std::vector<CodecSpec> v;
  for (const char* n : {"bf16", "fp16", "fp8e4m3", "int8", "int4"}) v.push_back(parse_codec(n));
  return v;
}

std::vector<CodecRates> measure_codec_rates(std::size_t count, int reps) {
  std::vector<float> x(count), acc(count, 0.0f);
  std::mt19937 g(1);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto& f : x) f = d(g);
  std::vector<CodecRates> out;
  using clock = std::chrono::steady_clock;
  for (const CodecSpec& s : auto_candidates()) {
    std::vector<std::uint8_t> p(encoded_bytes(s, count));
    double enc = 1e30, dec = 1e30;
    for (int r = 0; r < std::max(1, reps); ++r) {
      auto t0 = clock::now();
      encode(s, x.data(), count, p.data());
      auto t1 = clock::now();
      decode_accumulate(s, p.data(), count, acc.data());
      auto t2 = clock::now();
      enc = std::min(enc, std::chrono::duration<double>(t1 - t0).count());
      dec = std::min(dec, std::chrono::duration<double>(t2 - t1).count());
    }
    const double bytes = 4.0 * static_cast<double>(count);
    out.push_back(CodecRates{s, bytes / std::max(enc, 1e-9), bytes / std::max(dec, 1e-9)});
  }
  return out;
}

double predicted_seconds_uncompressed(std::size_t count, int world, const LinkModel& link, std::size_t elem_bytes) {
  if (world <= 1) return 0.0;
  return 2.0 * (world - 1) * link.alpha_s +
         2.0 * (world - 1) / world * static_cast<double>(elem_bytes) * static_cast<double>(count) / link.Bps;
}

double predicted_seconds(const CodecRates& r, std::size_t count, int world, const LinkModel& link,
                         const CodecRates* widen) {
  const double n = static_cast<double>(count);
  const double wire = static_cast<double>(wire_bytes_per_rank(r.spec, count, world, 0));
  double t = 2.0 * (world - 1) * link.alpha_s + wire / link.Bps + (n + n / world) * 4.0 / r.encode_Bps +
             2.0 * n * 4.0 / r.decode_Bps;
  // 16-bit input: widened to f32 before, rounded back after (the bf16 codec's own passes).
  if (widen != nullptr) t += n * 4.0 / widen->decode_Bps + n * 4.0 / widen->encode_Bps;
  return t;
}

CodecSpec choose_auto(const std::vector<CodecRates>& rates, std::size_t count, int world, const LinkModel& link,
                      double error_budget, double margin, std::size_t elem_bytes) {
  CodecSpec best;  // none
  if (world <= 1 || count == 0) return best;
  const CodecRates* widen = nullptr;
  if (elem_bytes < 4) {
    // The conversions are priced as the bf16 codec's passes (f32 -> 16 bits and back); a
    // rates table without bf16 prices them as each candidate's own, erring towards none.
    const auto bf16 = std::find_if(rates.begin(), rates.end(),
                                   [](const CodecRates& r) { return r.spec.kind == CodecKind::bf16; });
    if (bf16 != rates.end()) widen = &*bf16;
  }
  double best_t = predicted_seconds_uncompressed(count, world, link, elem_bytes) * (1.0 - margin);
  for (const CodecRates& r : rates) {
    if (requires_error_feedback(r.spec) || error_bound(r.spec) > error_budget) continue;
    const double t = predicted_seconds(r, count, world, link, elem_bytes < 4 ? (widen ? widen : &r) : nullptr);
    if (t < best_t) {
      best_t = t;
      best = r.spec;
    }
  }
  return best;
}

}  // namespace braid::compression
