// The single-process reference of the compressed all-reduce; see reference.hpp.
#include "compression/reference.hpp"

#include "kernels/host/rng.hpp"

#include <braid/error.hpp>

#include <cstring>

namespace braid::compression {
CodecSpec stream_spec(const CodecSpec& spec, int rank, Phase phase) noexcept {
  CodecSpec s = spec;
  s.seed = kernels::stream_seed(spec.seed, static_cast<std::uint32_t>(rank), static_cast<std::uint32_t>(phase));
  return s;
}

ShardRange shard_range(std::size_t count, int world, int rank) noexcept {
  // floor(r * count / W) without overflow: r*q + floor(r*rem / W), r*rem < W^2.
  const auto w = static_cast<std::size_t>(world);
  const std::size_t q = count / w, rem = count % w;
  auto at = [&](int r) {
    const auto rr = static_cast<std::size_t>(r);
    return rr * q + rr * rem / w;
  };
  return ShardRange{at(rank), at(rank + 1)};
}

std::vector<std::vector<float>> reference_allreduce(const ReferenceStep& st,
                                                    const std::vector<std::vector<float>>& inputs,
                                                    const std::vector<ErrorFeedbackStore*>& stores) {
  const int W = static_cast<int>(inputs.size());
  if (W < 1) throw Error(ErrorCode::InvalidUsage, "reference_allreduce: no ranks");
  const std::size_t count = inputs[0].size();
  for (const auto& v : inputs)
    if (v.size() != count) throw Error(ErrorCode::InvalidUsage, "reference_allreduce: ranks differ in count");
  const bool ef = !st.key.empty();
  if (ef && stores.size() != inputs.size())
    throw Error(ErrorCode::InvalidUsage, "reference_allreduce: error feedback needs one store per rank");
  const CodecSpec& spec = st.spec;
  std::vector<std::vector<float>> out(W, std::vector<float>(count, 0.0f));

  if (spec.kind == CodecKind::topk) {
    std::vector<std::vector<std::uint8_t>> payload(W, std::vector<std::uint8_t>(encoded_bytes(spec, count)));
    for (int r = 0; r < W; ++r) {
      if (ef) {
        float* res = stores[r]->residual(st.key, ResidualRole::worker, count);
        encode_add_feedback(spec, inputs[r].data(), res, count, payload[r].data(), st.step, 0);
      } else {
        encode(spec, inputs[r].data(), count, payload[r].data(), st.step, 0);
      }
    }
    for (int d = 0; d < W; ++d) {
      for (int r = 0; r < W; ++r) decode_accumulate(spec, payload[r].data(), count, out[d].data());
      if (st.average)
        for (auto& v : out[d]) v = v / static_cast<float>(W);
    }
    return out;
  }

  // Phase 1: every worker encodes every shard of its bucket.
  std::vector<std::vector<std::vector<std::uint8_t>>> shards(W);
  for (int r = 0; r < W; ++r) {
    const CodecSpec ws = stream_spec(spec, r, Phase::worker);
    float* res = ef ? stores[r]->residual(st.key, ResidualRole::worker, count) : nullptr;
    shards[r].resize(W);
    for (int s = 0; s < W; ++s) {
      const ShardRange sr = shard_range(count, W, s);
      shards[r][s].resize(encoded_bytes(spec, sr.size()));
      if (ef)
        encode_add_feedback(ws, inputs[r].data() + sr.begin, res + sr.begin, sr.size(), shards[r][s].data(),
                            st.step, sr.begin);
      else
        encode(ws, inputs[r].data() + sr.begin, sr.size(), shards[r][s].data(), st.step, sr.begin);
    }
  }
  // Phase 2: owner s sums its shard from every rank in rank order, then encodes it once.
  std::vector<std::vector<std::uint8_t>> reduced(W);
  for (int s = 0; s < W; ++s) {
    const ShardRange sr = shard_range(count, W, s);
    std::vector<float> acc(sr.size(), 0.0f);
    for (int r = 0; r < W; ++r) decode_accumulate(spec, shards[r][s].data(), sr.size(), acc.data());
    if (st.average)
      for (auto& v : acc) v = v / static_cast<float>(W);
    reduced[s].resize(encoded_bytes(spec, sr.size()));
    const CodecSpec os = stream_spec(spec, s, Phase::owner);
    if (ef) {
      float* res = stores[s]->residual(st.key, ResidualRole::owner, sr.size());
      encode_add_feedback(os, acc.data(), res, sr.size(), reduced[s].data(), st.step, sr.begin);
    } else {
      encode(os, acc.data(), sr.size(), reduced[s].data(), st.step, sr.begin);
    }
  }
  // Phase 3: every rank decodes every reduced shard.
  for (int d = 0; d < W; ++d) {
    for (int s = 0; s < W; ++s) {
      const ShardRange sr = shard_range(count, W, s);
      decode(spec, reduced[s].data(), sr.size(), out[d].data() + sr.begin);
    }
  }
  return out;
}

std::size_t wire_bytes_per_rank(const CodecSpec& spec, std::size_t count, int world, int rank) {
  if (spec.kind == CodecKind::topk) return static_cast<std::size_t>(world - 1) * encoded_bytes(spec, count);
  std::size_t b = 0;
  for (int s = 0; s < world; ++s)
    if (s != rank) b += encoded_bytes(spec, shard_range(count, world, s).size());
  return b + static_cast<std::size_t>(world - 1) * encoded_bytes(spec, shard_range(count, world, rank).size());
}

}  // namespace braid::compression
