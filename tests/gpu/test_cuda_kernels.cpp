// CUDA kernels (src/kernels/cuda) against the host kernels, bit for bit: every reduction
// dtype x op and divide, every codec's encode (plain, with feedback, add-feedback with the
// residual aliased), decode, decode-accumulate, the fused decode-reduce-encode step, and
// top-k, for counts 0, 1, odd, block tails and large, with misaligned pointers (f32 arrays
// offset by one element, payloads by 1-3 bytes) and NaN / inf / tiny / subnormal blocks.
//
// Label `gpu`. Without a GPU (or driver) every device test is skipped with the runtime's
// reason; the argument checks and the runtime query run everywhere.
#include <braid/config.hpp>

#include <gtest/gtest.h>

#if BRAID_HAVE_CUDA

#include "compression/codec.hpp"
#include "compression/framed.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/host/codec_kernels.hpp"
#include "kernels/host/reduce.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

namespace cu = braid::kernels::cuda;
namespace hk = braid::kernels;
namespace comp = braid::compression;
using braid::DataType;
using braid::ReduceOp;

// ---------------------------------------------------------------------------------------
// Runs everywhere: the runtime query and the argument checks (nothing is launched).

TEST(CudaRuntime, DeviceCountGivesAReasonWhenThereIsNone) {
  std::string reason = "unset";
  const int n = cu::device_count(&reason);
  EXPECT_GE(n, 0);
  if (n == 0) {
    EXPECT_FALSE(reason.empty());
    EXPECT_NE(reason, "unset");
    std::printf("no CUDA device here: %s\n", reason.c_str());
  } else {
    EXPECT_TRUE(reason.empty()) << reason;
  }
  EXPECT_EQ(cu::device_count(nullptr), n);  // no reason wanted: same answer, no crash
}

TEST(CudaRuntime, StatusStringNamesTheError) {
  EXPECT_NE(cu::status_string(cu::kInvalidValue).find("cudaErrorInvalidValue"), std::string::npos);
  EXPECT_NE(cu::status_string(cu::kNotSupported).find("cudaErrorNotSupported"), std::string::npos);
}

cu::DeviceCodec block_codec(hk::BlockFormat f, std::uint32_t block) {
  cu::DeviceCodec c;
  c.kind = cu::DeviceCodec::Kind::block;
  c.block.format = f;
  c.block.block = block;
  return c;
}

TEST(CudaArgs, BadArgumentsAreRefusedBeforeAnyLaunch) {
  float dummy = 0;
  std::uint8_t bytes[8] = {};
  for (std::uint32_t bad_block : {0u, 4u, 12u, 4104u, 8192u}) {
    cu::EncodeArgs e;
    e.codec = block_codec(hk::BlockFormat::int8, bad_block);
    e.in = &dummy;
    e.n = 1;
    e.out = bytes;
    EXPECT_EQ(cu::encode(e, nullptr), cu::kInvalidValue) << bad_block;
    cu::DecodeArgs d;
    d.codec = e.codec;
    d.in = bytes;
    d.n = 1;
    d.out = &dummy;
    EXPECT_EQ(cu::decode(d, nullptr), cu::kInvalidValue) << bad_block;
  }
  // A frame that cuts a scale block.
  for (std::size_t bad_frame : {1u, 255u, 300u}) {
    cu::EncodeArgs e;
    e.codec = block_codec(hk::BlockFormat::int8, 256);
    e.in = &dummy;
    e.n = 1;
    e.out = bytes;
    e.frame = bad_frame;
    EXPECT_EQ(cu::encode(e, nullptr), cu::kInvalidValue) << bad_frame;
    cu::DecodeArgs d;
    d.codec = e.codec;
    d.in = bytes;
    d.n = 1;
    d.out = &dummy;
    d.frame = bad_frame;
    EXPECT_EQ(cu::decode(d, nullptr), cu::kInvalidValue) << bad_frame;
  }
  cu::EncodeArgs e;
  e.codec = block_codec(static_cast<hk::BlockFormat>(9), 256);
  e.in = &dummy;
  e.n = 1;
  e.out = bytes;
  EXPECT_EQ(cu::encode(e, nullptr), cu::kInvalidValue);
  e.codec = cu::DeviceCodec{};
  e.in = nullptr;
  EXPECT_EQ(cu::encode(e, nullptr), cu::kInvalidValue);  // null input with n > 0

  cu::ReduceArgs r;
  r.dtype = static_cast<DataType>(braid::kNumDataTypes);
  r.n = 1;
  EXPECT_EQ(cu::reduce(r, nullptr), cu::kInvalidValue);
  r.dtype = DataType::f32;
  r.op = static_cast<ReduceOp>(braid::kNumReduceOps);
  EXPECT_EQ(cu::reduce(r, nullptr), cu::kInvalidValue);
  r.op = ReduceOp::sum;
  EXPECT_EQ(cu::reduce(r, nullptr), cu::kInvalidValue);  // null pointers

  cu::TopkEncodeArgs t;
  t.in = &dummy;
  t.out = bytes;
  t.workspace = bytes;
  t.n = 4;
  t.k = 0;
  EXPECT_EQ(cu::topk_encode(t, nullptr), cu::kInvalidValue);
  t.k = 5;
  EXPECT_EQ(cu::topk_encode(t, nullptr), cu::kInvalidValue);
  EXPECT_EQ(cu::topk_workspace_bytes(0, 1), 0u);
  EXPECT_EQ(cu::topk_workspace_bytes(4, 5), 0u);
  cu::TopkDecodeArgs td;
  td.n = 4;
  td.k = 2;
  td.in = bytes;
  td.out = &dummy;
  EXPECT_EQ(cu::topk_decode(td, nullptr), cu::kInvalidValue);  // no status slot

  cu::DecodeReduceEncodeArgs f;
  f.n = 3;
  EXPECT_EQ(cu::decode_reduce_encode(f, nullptr), cu::kInvalidValue);
}

TEST(CudaArgs, CountZeroIsANoOpWithoutLaunching) {
  cu::EncodeArgs e;
  e.codec = block_codec(hk::BlockFormat::sign1, 256);
  EXPECT_EQ(cu::encode(e, nullptr), 0);
  cu::DecodeArgs d;
  EXPECT_EQ(cu::decode(d, nullptr), 0);
  cu::ReduceArgs r;
  EXPECT_EQ(cu::reduce(r, nullptr), 0);
  cu::DivideArgs v;
  EXPECT_EQ(cu::divide(v, nullptr), 0);
  cu::DecodeReduceEncodeArgs f;
  EXPECT_EQ(cu::decode_reduce_encode(f, nullptr), 0);
}

// The spec list the device tests use: every codec family, both roundings, odd block sizes.
const char* const kCodecs[] = {"none",       "fp16",         "bf16",           "fp8e4m3",        "fp8e5m2",
                               "int8",       "int8:sr:seed=7", "int4",         "int4:sr:seed=99", "sign1",
                               "int8:block=8", "int4:block=4096", "sign1:block=24", "fp8e5m2:block=64",
                               "int4:sr:block=40", "mxfp8",      "mxfp4",        "topk:0.01",
                               "topk:0.3",         "topk:1"};

cu::DeviceCodec to_device(const comp::CodecSpec& s, std::uint64_t step, std::uint64_t offset) {
  cu::DeviceCodec c;
  switch (s.kind) {
    case comp::CodecKind::none: c.kind = cu::DeviceCodec::Kind::raw; return c;
    case comp::CodecKind::fp16: c.kind = cu::DeviceCodec::Kind::fp16; return c;
    case comp::CodecKind::bf16: c.kind = cu::DeviceCodec::Kind::bf16; return c;
    default: break;
  }
  c.kind = cu::DeviceCodec::Kind::block;
  switch (s.kind) {
    case comp::CodecKind::int8: c.block.format = hk::BlockFormat::int8; break;
    case comp::CodecKind::int4: c.block.format = hk::BlockFormat::int4; break;
    case comp::CodecKind::fp8e4m3: c.block.format = hk::BlockFormat::fp8e4m3; break;
    case comp::CodecKind::fp8e5m2: c.block.format = hk::BlockFormat::fp8e5m2; break;
    case comp::CodecKind::mxfp8: c.block.format = hk::BlockFormat::mxfp8; break;
    case comp::CodecKind::mxfp4: c.block.format = hk::BlockFormat::mxfp4; break;
    default: c.block.format = hk::BlockFormat::sign1; break;
  }
  c.block.block = static_cast<std::uint32_t>(s.block);
  c.block.stochastic = s.rounding == comp::Rounding::stochastic;
  c.block.seed = s.seed;
  c.block.step = step;
  c.block.offset = offset;
  return c;
}

TEST(CudaArgs, PayloadBytesMatchTheHostFormats) {
  for (const char* name : kCodecs) {
    const comp::CodecSpec s = comp::parse_codec(name);
    if (s.kind == comp::CodecKind::topk) continue;
    for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 255u, 257u, 4099u, 1000003u})
      EXPECT_EQ(cu::payload_bytes(to_device(s, 0, 0), n), comp::encoded_bytes(s, n)) << name << " n=" << n;
  }
}

// ---------------------------------------------------------------------------------------
// Device tests.

class Gpu : public ::testing::Test {
 protected:
  // Skips only where the host has no GPU (no driver, or no device). A GPU stack that
  // fails to start is a failure, and BRAID_TEST_REQUIRE_GPU=1 (set it on GPU machines)
  // makes a missing GPU one too, so that a broken setup cannot pass as "skipped".
  void SetUp() override {
    std::string reason;
    bool absent = false;
    if (cu::device_count(&reason, &absent) == 0) {
      const char* require = std::getenv("BRAID_TEST_REQUIRE_GPU");
      if (!absent || (require && std::string(require) == "1"))
        FAIL() << "no usable CUDA device" << (absent ? " and BRAID_TEST_REQUIRE_GPU=1" : "") << ": " << reason;
      GTEST_SKIP() << "no CUDA device, GPU test skipped: " << reason;
    }
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  void sync() { ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess); }
  cudaStream_t stream_ = nullptr;
};

// A device allocation with a byte offset (to test misaligned pointers).
class Dev {
 public:
  Dev(std::size_t bytes, std::size_t offset = 0) : offset_(offset), bytes_(bytes) {
    EXPECT_EQ(cudaMalloc(&base_, bytes + offset + 16), cudaSuccess);
  }
  ~Dev() { cudaFree(base_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <class T = std::uint8_t>
  T* get() const {
    return reinterpret_cast<T*>(static_cast<std::uint8_t*>(base_) + offset_);
  }
  void put(const void* src, std::size_t bytes) const {
    ASSERT_EQ(cudaMemcpy(get(), src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  void fill(int byte) const { ASSERT_EQ(cudaMemset(base_, byte, bytes_ + offset_ + 16), cudaSuccess); }
  template <class T>
  std::vector<T> take(std::size_t count) const {
    std::vector<T> v(count);
    EXPECT_EQ(cudaMemcpy(v.data(), get(), count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  void* base_ = nullptr;
  std::size_t offset_, bytes_;
};

template <class T>
void put_vec(const Dev& d, const std::vector<T>& v) {
  if (!v.empty()) d.put(v.data(), v.size() * sizeof(T));
}

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// First index where two float arrays differ in bits (NaN == NaN of any payload only when
// `nan_any`), or -1.
long first_diff(const float* a, const float* b, std::size_t n, bool nan_any = false) {
  for (std::size_t i = 0; i < n; ++i) {
    if (bits(a[i]) == bits(b[i])) continue;
    if (nan_any && std::isnan(a[i]) && std::isnan(b[i])) continue;
    return static_cast<long>(i);
  }
  return -1;
}
long first_diff_bytes(const std::uint8_t* a, const std::uint8_t* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return static_cast<long>(i);
  return -1;
}

// Gradient-like values; with `specials`, blocks holding NaN / inf / only tiny values,
// subnormals, fp16-overflowing magnitudes, signed zeros and equal magnitudes (top-k ties).
std::vector<float> gradient(std::size_t n, std::uint32_t seed, bool specials) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng) * 0.01f;
  if (specials && n > 0) {
    auto at = [&](std::size_t i, float x) {
      if (i < n) v[i] = x;
    };
    at(n / 2, std::numeric_limits<float>::quiet_NaN());
    at(n / 3 + 1, -std::numeric_limits<float>::infinity());
    at(n / 5 + 2, 1e30f);
    at(n / 7 + 3, -70000.0f);
    at(n / 9, -0.0f);
    at(n / 11, 1e-41f);  // subnormal
    for (std::size_t i = 0; i < 300 && 600 + i < n; ++i) v[600 + i] = 1e-35f * static_cast<float>(i % 5);
    for (std::size_t i = 0; i < 16 && 2000 + 3 * i < n; ++i) v[2000 + 3 * i] = (i % 2 ? -0.5f : 0.5f);  // ties
  }
  return v;
}

// ---------------------------------------------------------------------------------------
// Reduction.

std::vector<std::uint8_t> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> v(n);
  for (auto& b : v) b = static_cast<std::uint8_t>(rng());
  return v;
}

// Operands: raw random bits for 16-bit floats and integers (all NaN/inf/subnormal
// patterns); f32/f64 are random normals with some specials.
std::vector<std::uint8_t> operand(DataType t, std::size_t n, std::uint32_t seed) {
  if (t == DataType::f32 || t == DataType::f64) {
    std::vector<float> g = gradient(n, seed, true);
    // Operands get their specials at different places, so most NaN results come from one
    // NaN operand (whose bits must match exactly) rather than two.
    std::rotate(g.begin(), g.begin() + static_cast<std::ptrdiff_t>(seed % 5 % (n ? n : 1)), g.end());
    std::vector<std::uint8_t> out(n * braid::dtype_size(t));
    for (std::size_t i = 0; i < n; ++i) {
      if (t == DataType::f32) {
        std::memcpy(out.data() + 4 * i, &g[i], 4);
      } else {
        const double d = static_cast<double>(g[i]) * 1.000000001;
        std::memcpy(out.data() + 8 * i, &d, 8);
      }
    }
    return out;
  }
  return random_bytes(n * braid::dtype_size(t), seed);
}

bool same_elem(DataType t, const std::uint8_t* a, const std::uint8_t* b) {
  const std::size_t s = braid::dtype_size(t);
  if (std::memcmp(a, b, s) == 0) return true;
  // The one documented freedom: the payload of a NaN computed from two NaNs.
  switch (t) {
    case DataType::f32: {
      float x, y;
      std::memcpy(&x, a, 4), std::memcpy(&y, b, 4);
      return std::isnan(x) && std::isnan(y);
    }
    case DataType::f64: {
      double x, y;
      std::memcpy(&x, a, 8), std::memcpy(&y, b, 8);
      return std::isnan(x) && std::isnan(y);
    }
    case DataType::f16: {
      std::uint16_t x, y;
      std::memcpy(&x, a, 2), std::memcpy(&y, b, 2);
      return (x & 0x7fff) > 0x7c00 && (y & 0x7fff) > 0x7c00;
    }
    case DataType::bf16: {
      std::uint16_t x, y;
      std::memcpy(&x, a, 2), std::memcpy(&y, b, 2);
      return (x & 0x7fff) > 0x7f80 && (y & 0x7fff) > 0x7f80;
    }
    default: return false;
  }
}

// fp8 operands are random bytes (NaNs and e5m2 infinities included); results must match
// bit for bit (NaN is always 0x7f).
const DataType kTypes[] = {DataType::f32, DataType::f64, DataType::f16,    DataType::bf16,  DataType::i8,
                           DataType::u8,  DataType::i32, DataType::i64,    DataType::f8e4m3, DataType::f8e5m2};
const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg};

struct Offsets {
  std::size_t d, a, b;  // in elements
  bool in_place;        // dst == a
};

TEST_F(Gpu, ReduceEveryTypeAndOpMatchesTheHost) {
  const Offsets kOffsets[] = {{0, 0, 0, false}, {1, 1, 1, false}, {1, 0, 0, false}, {0, 3, 1, false},
                              {0, 0, 0, true},  {3, 3, 5, true}};
  for (DataType t : kTypes)
    for (ReduceOp op : kOps)
      for (std::size_t n : {1u, 5u, 33u, 1000u, 65537u})
        for (const Offsets& o : kOffsets) {
          SCOPED_TRACE(testing::Message() << "dtype " << static_cast<int>(t) << " op " << static_cast<int>(op)
                                          << " n " << n << " offsets " << o.d << "/" << o.a << "/" << o.b
                                          << (o.in_place ? " in place" : ""));
          const std::size_t s = braid::dtype_size(t);
          const auto a = operand(t, n, 11 + static_cast<std::uint32_t>(n));
          const auto b = operand(t, n, 23 + static_cast<std::uint32_t>(n));
          std::vector<std::uint8_t> want(n * s);
          hk::reduce(t, op, want.data(), a.data(), b.data(), n);
          Dev da(n * s, o.a * s), db(n * s, o.b * s), dd(n * s, o.d * s);
          put_vec(da, a);
          put_vec(db, b);
          cu::ReduceArgs r;
          r.dtype = t;
          r.op = op;
          r.a = da.get();
          r.b = db.get();
          r.dst = o.in_place ? da.get() : dd.get();
          r.n = n;
          ASSERT_EQ(cu::reduce(r, stream_), 0);
          sync();
          const auto got = (o.in_place ? da : dd).take<std::uint8_t>(n * s);
          for (std::size_t i = 0; i < n; ++i)
            ASSERT_TRUE(same_elem(t, got.data() + i * s, want.data() + i * s)) << "element " << i;
        }
}

TEST_F(Gpu, DivideMatchesTheHost) {
  for (DataType t : kTypes)
    for (int divisor : {3, -1, 7, 0, 1})
      for (std::size_t n : {1u, 77u, 10001u}) {
        SCOPED_TRACE(testing::Message() << "dtype " << static_cast<int>(t) << " divisor " << divisor << " n " << n);
        const std::size_t s = braid::dtype_size(t);
        auto want = operand(t, n, 5);
        Dev d(n * s, s);
        put_vec(d, want);
        hk::divide(t, want.data(), n, divisor);
        cu::DivideArgs a;
        a.dtype = t;
        a.buf = d.get();
        a.n = n;
        a.divisor = divisor;
        ASSERT_EQ(cu::divide(a, stream_), 0);
        sync();
        const auto got = d.take<std::uint8_t>(n * s);
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_TRUE(same_elem(t, got.data() + i * s, want.data() + i * s)) << "element " << i;
      }
}

// ---------------------------------------------------------------------------------------
// Codecs.

// Encodes on the device; topk allocates its workspace.
void device_encode(const comp::CodecSpec& s, const float* in, const float* add, std::size_t n, std::uint8_t* out,
                   float* residual, std::uint64_t step, std::uint64_t offset, cudaStream_t st) {
  if (s.kind == comp::CodecKind::topk) {
    if (n == 0) return;
    const std::size_t k = comp::topk_k(s, n);
    const std::size_t ws = cu::topk_workspace_bytes(n, k);
    ASSERT_GT(ws, 0u);
    Dev w(ws);
    const cu::TopkEncodeArgs a{in, add, n, k, out, residual, w.get(), ws};
    ASSERT_EQ(cu::topk_encode(a, st), 0);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    return;
  }
  const cu::EncodeArgs a{to_device(s, step, offset), in, add, n, out, residual};
  ASSERT_EQ(cu::encode(a, st), 0);
}

void device_decode(const comp::CodecSpec& s, const std::uint8_t* in, std::size_t n, float* out, bool acc,
                   cudaStream_t st, int* status_out = nullptr) {
  if (s.kind == comp::CodecKind::topk) {
    Dev status(sizeof(int));
    const cu::TopkDecodeArgs a{in, n, comp::topk_k(s, n), out, acc, status.get<int>()};
    ASSERT_EQ(cu::topk_decode(a, st), 0);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    const int v = status.take<int>(1)[0];
    if (status_out)
      *status_out = v;
    else
      ASSERT_EQ(v, 0);
    return;
  }
  const cu::DecodeArgs a{to_device(s, 0, 0), in, n, out, acc};
  ASSERT_EQ(cu::decode(a, st), 0);
}

// feedback_in_place: the residual is written over the input (residual == in), which the
// encoders allow.
enum class Mode { plain, feedback, add_feedback, feedback_in_place };

struct CodecCase {
  std::size_t in_off;   // elements
  std::size_t pay_off;  // bytes
  Mode mode;
  std::uint64_t step, offset;
};

void check_encode(const char* name, std::size_t n, const CodecCase& c, cudaStream_t st) {
  SCOPED_TRACE(testing::Message() << name << " n=" << n << " in_off=" << c.in_off << " pay_off=" << c.pay_off
                                  << " mode=" << static_cast<int>(c.mode) << " step=" << c.step
                                  << " offset=" << c.offset);
  const comp::CodecSpec s = comp::parse_codec(name);
  const std::size_t bytes = comp::encoded_bytes(s, n);
  const std::vector<float> x = gradient(n, 1000 + static_cast<std::uint32_t>(n), true);
  std::vector<float> res0 = gradient(n, 77, false);  // an earlier step's residual
  for (auto& r : res0) r *= 0.1f;
  // Host reference.
  std::vector<std::uint8_t> want(bytes, 0xab);
  std::vector<float> want_res = res0;
  switch (c.mode) {
    case Mode::plain: comp::encode(s, x.data(), n, want.data(), c.step, c.offset); break;
    case Mode::feedback:
      comp::encode_with_feedback(s, x.data(), n, want.data(), want_res.data(), c.step, c.offset);
      break;
    case Mode::add_feedback:
      comp::encode_add_feedback(s, x.data(), want_res.data(), n, want.data(), c.step, c.offset);
      break;
    case Mode::feedback_in_place:
      want_res = x;
      comp::encode_with_feedback(s, want_res.data(), n, want.data(), want_res.data(), c.step, c.offset);
      break;
  }
  // Device, with a poisoned output so that unwritten padding shows.
  Dev din(4 * n, 4 * c.in_off), dres(4 * n, 4 * c.in_off), dout(bytes, c.pay_off);
  put_vec(din, x);
  put_vec(dres, res0);
  dout.fill(0xab);
  const bool in_place = c.mode == Mode::feedback_in_place;
  float* residual = c.mode == Mode::plain ? nullptr : in_place ? din.get<float>() : dres.get<float>();
  const float* add = c.mode == Mode::add_feedback ? dres.get<float>() : nullptr;
  device_encode(s, din.get<float>(), add, n, dout.get(), residual, c.step, c.offset, st);
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  const auto got = dout.take<std::uint8_t>(bytes + 8);
  EXPECT_EQ(first_diff_bytes(got.data(), want.data(), bytes), -1) << "payload differs";
  for (std::size_t i = bytes; i < bytes + 8; ++i) ASSERT_EQ(got[i], 0xab) << "wrote past the payload";
  if (c.mode != Mode::plain) {
    const auto gres = (in_place ? din : dres).take<float>(n);
    EXPECT_EQ(first_diff(gres.data(), want_res.data(), n), -1) << "residual differs";
  }
}

TEST_F(Gpu, EncodeMatchesTheHostBitForBit) {
  const CodecCase kCases[] = {{0, 0, Mode::plain, 0, 0},        {1, 1, Mode::plain, 3, 5},
                              {0, 2, Mode::feedback, 1, 0},     {1, 3, Mode::add_feedback, 9, 1234567},
                              {0, 0, Mode::add_feedback, 0, 0}, {1, 0, Mode::feedback_in_place, 4, 77}};
  for (const char* name : kCodecs)
    for (std::size_t n : {1u, 7u, 8u, 257u, 4099u, (1u << 20) + 3u})
      for (const CodecCase& c : kCases) check_encode(name, n, c, stream_);
}

TEST_F(Gpu, DecodeAndAccumulateMatchTheHostBitForBit) {
  for (const char* name : kCodecs)
    for (std::size_t n : {1u, 7u, 8u, 257u, 4099u, (1u << 20) + 3u})
      for (std::size_t pay_off : {0u, 1u})
        for (bool acc : {false, true}) {
          SCOPED_TRACE(testing::Message() << name << " n=" << n << " pay_off=" << pay_off << " acc=" << acc);
          const comp::CodecSpec s = comp::parse_codec(name);
          const std::size_t bytes = comp::encoded_bytes(s, n);
          const auto x = gradient(n, 5 + static_cast<std::uint32_t>(n), true);
          std::vector<std::uint8_t> payload(bytes);
          comp::encode(s, x.data(), n, payload.data(), 2, 0);
          std::vector<float> want = gradient(n, 6, false);
          const std::vector<float> out0 = want;
          if (acc)
            comp::decode_accumulate(s, payload.data(), n, want.data());
          else
            comp::decode(s, payload.data(), n, want.data());
          Dev dp(bytes, pay_off), dout(4 * n, 4 * pay_off);
          put_vec(dp, payload);
          put_vec(dout, out0);
          device_decode(s, dp.get(), n, dout.get<float>(), acc, stream_);
          sync();
          const auto got = dout.take<float>(n);
          EXPECT_EQ(first_diff(got.data(), want.data(), n), -1);
        }
}

// The framed layout the compressed all-reduce sends (compression/framed.hpp: a payload
// per frame, scales first), encoded and decoded with every frame in one launch: bit for
// bit encode_framed / decode_framed / decode_add_framed, residuals included, for whole
// frames, a short last frame, one frame and the smallest frame.
TEST_F(Gpu, FramedPayloadsInOneLaunchMatchTheHost) {
  for (const char* name : kCodecs) {
    const comp::CodecSpec s = comp::parse_codec(name);
    if (s.kind == comp::CodecKind::topk) continue;  // a top-k payload is never cut
    const std::size_t unit = static_cast<std::size_t>(std::max(8, s.block));
    for (std::size_t frame : {unit, comp::frame_values(s, 1u << 20)})
      for (std::size_t n : {frame, 3 * frame, 3 * frame + 5, std::size_t{(1u << 20) + 3u}}) {
        SCOPED_TRACE(testing::Message() << name << " frame=" << frame << " n=" << n);
        const std::size_t bytes = comp::framed_bytes(s, frame, n);
        const auto x = gradient(n, 11 + static_cast<std::uint32_t>(n), true);
        std::vector<float> res0 = gradient(n, 12, false);
        for (auto& r : res0) r *= 0.1f;
        std::vector<std::uint8_t> want(bytes, 0xab);
        std::vector<float> want_res = res0;
        comp::encode_framed(s, frame, x.data(), want_res.data(), n, want.data(), 7, 4096);
        Dev din(4 * n), dres(4 * n), dout(bytes + 8);
        put_vec(din, x);
        put_vec(dres, res0);
        dout.fill(0xab);
        cu::EncodeArgs e{to_device(s, 7, 4096), din.get<float>(), dres.get<float>(), n, dout.get(), dres.get<float>()};
        e.frame = frame;
        ASSERT_EQ(cu::encode(e, stream_), 0);
        sync();
        const auto got = dout.take<std::uint8_t>(bytes + 8);
        EXPECT_EQ(first_diff_bytes(got.data(), want.data(), bytes), -1) << "payload differs";
        for (std::size_t i = bytes; i < bytes + 8; ++i) ASSERT_EQ(got[i], 0xab) << "wrote past the payload";
        const auto gres = dres.take<float>(n);
        EXPECT_EQ(first_diff(gres.data(), want_res.data(), n), -1) << "residual differs";
        for (bool acc : {false, true}) {
          std::vector<float> out = gradient(n, 13, false);
          Dev dsum(4 * n);
          put_vec(dsum, out);
          if (acc)
            comp::decode_add_framed(s, frame, want.data(), n, out.data());
          else
            comp::decode_framed(s, frame, want.data(), n, out.data(), false);
          cu::DecodeArgs d{to_device(s, 0, 0), dout.get(), n, dsum.get<float>(), acc};
          d.frame = frame;
          ASSERT_EQ(cu::decode(d, stream_), 0);
          sync();
          const auto dec = dsum.take<float>(n);
          EXPECT_EQ(first_diff(dec.data(), out.data(), n), -1) << (acc ? "decode_add" : "decode") << " differs";
        }
      }
  }
}

TEST_F(Gpu, TopkDecodeRejectsCorruptPayloadsWithoutWriting) {
  const comp::CodecSpec s = comp::parse_codec("topk:0.1");
  const std::size_t n = 1000, k = comp::topk_k(s, n);
  const auto x = gradient(n, 3, false);
  std::vector<std::uint8_t> payload(comp::encoded_bytes(s, n));
  comp::encode(s, x.data(), n, payload.data());
  for (int corruption = 0; corruption < 2; ++corruption) {
    auto bad = payload;
    const std::uint32_t v = corruption == 0 ? static_cast<std::uint32_t>(n) : 0u;  // out of range / not ascending
    std::memcpy(bad.data() + 4 * (k / 2), &v, 4);
    const auto out0 = gradient(n, 4, false);
    Dev dp(bad.size()), dout(4 * n);
    put_vec(dp, bad);
    put_vec(dout, out0);
    for (bool acc : {false, true}) {
      int status = -1;
      device_decode(s, dp.get(), n, dout.get<float>(), acc, stream_, &status);
      EXPECT_EQ(status, 1);
      const auto got = dout.take<float>(n);
      EXPECT_EQ(first_diff(got.data(), out0.data(), n), -1) << "a rejected payload wrote output";
    }
  }
}

// The compressed ring's step against the host sequence it replaces.
TEST_F(Gpu, DecodeReduceEncodeMatchesTheHostSequence) {
  for (const char* name : kCodecs) {
    const comp::CodecSpec s = comp::parse_codec(name);
    if (s.kind == comp::CodecKind::topk) continue;  // no ring step for topk (whole-bucket payloads)
    for (std::size_t n : {1u, 9u, 257u, 4099u, (1u << 20) + 3u})
      for (int variant = 0; variant < 4; ++variant) {
        const bool ef = variant & 1, in_place = variant & 2;
        SCOPED_TRACE(testing::Message() << name << " n=" << n << " ef=" << ef << " in_place=" << in_place);
        const std::uint64_t step = 4, offset = 96;
        const auto x_remote = gradient(n, 31, true), local = gradient(n, 32, false);
        std::vector<std::uint8_t> in_payload(comp::encoded_bytes(s, n));
        comp::encode(s, x_remote.data(), n, in_payload.data(), step, offset);
        std::vector<float> res0 = gradient(n, 33, false);
        // Host: acc = local + decode(in); out = encode(acc [+ residual]).
        std::vector<float> acc = local, want_res = res0;
        comp::decode_accumulate(s, in_payload.data(), n, acc.data());
        std::vector<std::uint8_t> want(in_payload.size());
        if (ef)
          comp::encode_add_feedback(s, acc.data(), want_res.data(), n, want.data(), step, offset);
        else
          comp::encode(s, acc.data(), n, want.data(), step, offset);
        Dev dpay(in_payload.size(), 1), dlocal(4 * n, 4), dacc(4 * n), dres(4 * n, 4), dout(want.size(), 3);
        put_vec(dpay, in_payload);
        put_vec(dlocal, local);
        put_vec(dres, res0);
        cu::DecodeReduceEncodeArgs a;
        a.codec = to_device(s, step, offset);
        a.in_payload = dpay.get();
        a.local = dlocal.get<float>();
        a.n = n;
        a.acc_out = in_place ? dlocal.get<float>() : dacc.get<float>();
        a.residual = ef ? dres.get<float>() : nullptr;
        a.out_payload = dout.get();
        ASSERT_EQ(cu::decode_reduce_encode(a, stream_), 0);
        sync();
        const auto got = dout.take<std::uint8_t>(want.size());
        EXPECT_EQ(first_diff_bytes(got.data(), want.data(), want.size()), -1) << "payload differs";
        const auto gacc = (in_place ? dlocal : dacc).take<float>(n);
        EXPECT_EQ(first_diff(gacc.data(), acc.data(), n), -1) << "acc differs";
        if (ef) {
          const auto gres = dres.take<float>(n);
          EXPECT_EQ(first_diff(gres.data(), want_res.data(), n), -1) << "residual differs";
        }
      }
  }
}

// 64 Mi + 3 values: the grid-stride loops wrap several times and 32-bit indexing would
// overflow in the byte offsets of the wider arrays.
TEST_F(Gpu, LargeCountsMatchTheHost) {
  const std::size_t n = (std::size_t{64} << 20) + 3;
  const CodecCase c{1, 1, Mode::add_feedback, 7, 11};
  for (const char* name : {"int8:sr", "sign1", "fp16", "int4", "topk:0.001"}) check_encode(name, n, c, stream_);
  const auto a = operand(DataType::f32, n, 1), b = operand(DataType::f32, n, 2);
  std::vector<std::uint8_t> want(4 * n);
  hk::reduce(DataType::f32, ReduceOp::sum, want.data(), a.data(), b.data(), n);
  Dev da(4 * n), db(4 * n, 4), dd(4 * n);
  put_vec(da, a);
  put_vec(db, b);
  cu::ReduceArgs r;
  r.a = da.get();
  r.b = db.get();
  r.dst = dd.get();
  r.n = n;
  ASSERT_EQ(cu::reduce(r, stream_), 0);
  sync();
  const auto got = dd.take<std::uint8_t>(4 * n);
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_TRUE(same_elem(DataType::f32, got.data() + 4 * i, want.data() + 4 * i)) << i;
}

}  // namespace

#else  // !BRAID_HAVE_CUDA

TEST(CudaKernels, BuiltWithoutCuda) {
  GTEST_SKIP() << "braid was built without CUDA (BRAID_HAVE_CUDA=0): configure with -DBRAID_WITH_CUDA=ON "
                  "on a host with nvcc to build and run these tests";
}

#endif
