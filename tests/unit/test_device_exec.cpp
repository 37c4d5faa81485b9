// The direct device path's codec steps (core::DeviceExec::encode, decode, decode_add;
// docs/gpu.md "Compressed calls on the device"), on the process's device runtime: the
// host emulation here (BRAID_GPU_BACKEND=emulated unless the environment names another
// backend), the CUDA kernels under scripts/gpu_check.sh (BRAID_GPU_BACKEND=cuda).
//
// What is checked:
// * every codec family (fp16, bf16, int8 with stochastic rounding, int4, fp8, sign1, topk),
//   with and without an error-feedback residual, over several frames and a short last
//   one, at an offset that keys the RNG: the device payload, residual and decoded values
//   are the host's framed functions' bit for bit (compression/framed.hpp);
// * decode with sum_start turns a decoded -0.0f into +0.0f, as the host does;
// * a malformed topk payload (indices not ascending) leaves the output as it was and
//   makes failure() name the step, which is what the engine turns into the call's error.
#include "compression/codec.hpp"
#include "compression/framed.hpp"
#include "core/config.hpp"
#include "core/device_exec.hpp"
#include "gpu/runtime.hpp"

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace braid;

namespace {

const bool kBackendSet = [] {
  ::setenv("BRAID_GPU_BACKEND", "emulated", 0);
  return true;
}();

gpu::Runtime& rt() { return core::gpu_runtime(); }

/// A DeviceExec of device 0 driven from this thread, as DeviceFlow drives it.
struct Exec {
  Exec() : d(rt(), 0) {}
  template <typename T>
  T* device(std::size_t n) {
    return reinterpret_cast<T*>(d.take_device(n * sizeof(T)));
  }
  template <typename T>
  void put(T* dev, const std::vector<T>& host) {
    rt().copy(dev, host.data(), host.size() * sizeof(T));
  }
  template <typename T>
  std::vector<T> get(const T* dev, std::size_t n) {
    d.synchronize();
    std::vector<T> host(n);
    rt().copy(host.data(), dev, n * sizeof(T));
    return host;
  }
  core::DeviceExec d;
};

std::vector<float> values(std::size_t n, float salt) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::sin(0.013f * static_cast<float>(i) + salt) * (1.0f + static_cast<float>(i % 7));
  v[3] = -0.0f;
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class DeviceCodecSteps : public ::testing::TestWithParam<const char*> {};

TEST_P(DeviceCodecSteps, MatchTheHostFramedFunctionsBitForBit) {
  if (rt().device_count() == 0) GTEST_SKIP() << "no device runtime: " << rt().describe();
  const auto spec = compression::parse_codec(GetParam());
  // Several frames and a short last one (topk: its frame is the whole payload).
  const std::size_t n = 3 * 8192 + 1000;
  const std::size_t frame = compression::frame_values(spec, n);
  const std::size_t bytes = compression::framed_bytes(spec, frame, n);
  const std::uint64_t step = 5, offset = 4096;
  const auto x = values(n, 0.5f), residual0 = values(n, 1.5f);
  for (bool feedback : {false, true}) {
    SCOPED_TRACE(std::string(GetParam()) + (feedback ? " with error feedback" : ""));
    // The host's framed functions.
    std::vector<std::uint8_t> host_payload(bytes);
    std::vector<float> host_residual = residual0;
    compression::encode_framed(spec, frame, x.data(), feedback ? host_residual.data() : nullptr, n, host_payload.data(),
                               step, offset);
    std::vector<float> host_decoded(n), host_sum(n, 0.0f), host_acc = residual0;
    compression::decode_framed(spec, frame, host_payload.data(), n, host_decoded.data(), false);
    compression::decode_framed(spec, frame, host_payload.data(), n, host_sum.data(), true);
    compression::decode_add_framed(spec, frame, host_payload.data(), n, host_acc.data());

    // The same on the device.
    Exec e;
    float* dx = e.device<float>(n);
    float* dres = e.device<float>(n);
    auto* dpay = e.device<std::uint8_t>(bytes);
    float* ddec = e.device<float>(n);
    float* dsum = e.device<float>(n);
    float* dacc = e.device<float>(n);
    e.put(dx, x);
    e.put(dres, residual0);
    e.put(dacc, residual0);
    e.put(dsum, std::vector<float>(n, 7.0f));  // sum_start must not read what was there
    e.d.encode(spec, frame, dx, feedback ? dres : nullptr, n, dpay, step, offset);
    e.d.decode(spec, frame, dpay, n, ddec, false, "decode");
    e.d.decode(spec, frame, dpay, n, dsum, true, "decode from +0");
    e.d.decode_add(spec, frame, dpay, n, dacc, "decode-and-add");
    EXPECT_EQ(e.get(dpay, bytes), host_payload) << "payload";
    EXPECT_TRUE(same_bits(e.get(dres, n), feedback ? host_residual : residual0)) << "residual";
    EXPECT_TRUE(same_bits(e.get(ddec, n), host_decoded)) << "decode";
    EXPECT_TRUE(same_bits(e.get(dsum, n), host_sum)) << "decode with sum_start";
    EXPECT_TRUE(same_bits(e.get(dacc, n), host_acc)) << "decode-and-add";
    EXPECT_EQ(e.d.failure(), "");
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, DeviceCodecSteps,
                         ::testing::Values("fp16", "bf16", "int8:sr:seed=9", "int4:block=64", "fp8e4m3", "fp8e5m2",
                                           "sign1", "mxfp8", "mxfp4", "topk:0.01"),
                         [](const auto& param_info) {
                           std::string s = param_info.param;
                           for (char& c : s)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

TEST(DeviceCodecSteps, SumStartMakesADecodedNegativeZeroPositive) {
  if (rt().device_count() == 0) GTEST_SKIP() << "no device runtime: " << rt().describe();
  const auto spec = compression::parse_codec("fp16");
  const std::size_t n = 64, frame = compression::frame_values(spec, n);
  std::vector<float> x(n, -0.0f);
  Exec e;
  float* dx = e.device<float>(n);
  auto* dpay = e.device<std::uint8_t>(compression::framed_bytes(spec, frame, n));
  float* out = e.device<float>(n);
  e.put(dx, x);
  e.d.encode(spec, frame, dx, nullptr, n, dpay, 0, 0);
  e.d.decode(spec, frame, dpay, n, out, true, "decode from +0");
  for (float v : e.get(out, n)) ASSERT_FALSE(std::signbit(v)) << "+0.0f + -0.0f is +0.0f";
  e.d.decode(spec, frame, dpay, n, out, false, "decode");
  for (float v : e.get(out, n)) ASSERT_TRUE(std::signbit(v)) << "a plain decode keeps -0.0f";
}

TEST(DeviceCodecSteps, AMalformedTopkPayloadWritesNothingAndNamesTheStep) {
  if (rt().device_count() == 0) GTEST_SKIP() << "no device runtime: " << rt().describe();
  const auto spec = compression::parse_codec("topk:0.5");
  const std::size_t n = 8, k = compression::topk_k(spec, n);
  ASSERT_EQ(k, 4u);
  // Indices 5, 2, ... are not ascending: a peer's payload that must not be applied.
  std::vector<std::uint32_t> payload = {5, 2, 6, 7, 0, 0, 0, 0};
  const float one = 1.0f;
  for (std::size_t i = 4; i < 8; ++i) std::memcpy(&payload[i], &one, 4);
  Exec e;
  auto* dpay = e.device<std::uint32_t>(payload.size());
  float* acc = e.device<float>(n);
  e.put(dpay, payload);
  e.put(acc, std::vector<float>(n, 3.0f));
  e.d.decode_add(spec, n, reinterpret_cast<const std::uint8_t*>(dpay), n, acc, "step 7 (decode-and-add from rank 1)");
  EXPECT_EQ(e.get(acc, n), std::vector<float>(n, 3.0f)) << "a rejected payload changed the output";
  const std::string why = e.d.failure();
  EXPECT_NE(why.find("step 7 (decode-and-add from rank 1)"), std::string::npos) << why;
}

}  // namespace
