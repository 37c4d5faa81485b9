// Names and sizes of the public enums.
#include <braid/types.hpp>

#include "base/text.hpp"

#include <algorithm>
#include <cctype>
#include <string>

namespace braid {

std::size_t dtype_size(DataType t) noexcept {
  switch (t) {
    case DataType::f32: return 4;
    case DataType::f64: return 8;
    case DataType::f16: return 2;
    case DataType::bf16: return 2;
    case DataType::i8: return 1;
    case DataType::u8: return 1;
    case DataType::i32: return 4;
    case DataType::i64: return 8;
    case DataType::f8e4m3: return 1;
    case DataType::f8e5m2: return 1;
  }
  return 0;
}

bool is_floating(DataType t) noexcept {
  return t == DataType::f32 || t == DataType::f64 || t == DataType::f16 || t == DataType::bf16 ||
         t == DataType::f8e4m3 || t == DataType::f8e5m2;
}

std::string_view to_string(DataType t) noexcept {
  static constexpr std::string_view names[] = {"f32", "f64", "f16", "bf16", "i8",
                                                    "u8",  "i32", "i64", "f8e4m3", "f8e5m2"};
  const auto i = static_cast<unsigned>(t);
  return i < std::size(names) ? names[i] : "invalid";
}

std::string_view to_string(ReduceOp op) noexcept {
  static constexpr std::string_view names[] = {"sum", "prod", "min", "max", "avg", "premul_sum"};
  const auto i = static_cast<unsigned>(op);
  return i < std::size(names) ? names[i] : "invalid";
}

std::string_view to_string(Algorithm a) noexcept {
  static constexpr std::string_view names[] = {"auto", "ring", "tree", "rhd", "hier"};
  const auto i = static_cast<unsigned>(a);
  return i < std::size(names) ? names[i] : "invalid";
}

std::string_view to_string(MemoryKind m) noexcept {
  static constexpr std::string_view names[] = {"automatic", "host", "device"};
  const auto i = static_cast<unsigned>(m);
  return i < std::size(names) ? names[i] : "invalid";
}

std::optional<DataType> parse_dtype(std::string_view name) noexcept {
  const std::string n = base::lower(name);
  struct Alias { const char* name; DataType t; };
  static constexpr Alias aliases[] = {
      {"f32", DataType::f32},   {"float", DataType::f32},   {"float32", DataType::f32},
      {"f64", DataType::f64},   {"double", DataType::f64},  {"float64", DataType::f64},
      {"f16", DataType::f16},   {"half", DataType::f16},    {"float16", DataType::f16},
      {"bf16", DataType::bf16}, {"bfloat16", DataType::bf16},
      {"i8", DataType::i8},     {"int8", DataType::i8},     {"char", DataType::i8},
      {"u8", DataType::u8},     {"uint8", DataType::u8},
      {"i32", DataType::i32},   {"int32", DataType::i32},   {"int", DataType::i32},
      {"i64", DataType::i64},   {"int64", DataType::i64},   {"long", DataType::i64},
      {"f8e4m3", DataType::f8e4m3}, {"fp8e4m3", DataType::f8e4m3},
      {"float8_e4m3fn", DataType::f8e4m3}, {"e4m3", DataType::f8e4m3},
      {"f8e5m2", DataType::f8e5m2}, {"fp8e5m2", DataType::f8e5m2},
      {"float8_e5m2", DataType::f8e5m2}, {"e5m2", DataType::f8e5m2},
  };
  for (const auto& a : aliases)
    if (n == a.name) return a.t;
  return std::nullopt;
}

std::optional<ReduceOp> parse_op(std::string_view name) noexcept {
  const std::string n = base::lower(name);
  for (int i = 0; i < kNumReduceOps; ++i)
    if (n == to_string(static_cast<ReduceOp>(i))) return static_cast<ReduceOp>(i);
  return std::nullopt;
}

std::optional<Algorithm> parse_algorithm(std::string_view name) noexcept {
  const std::string n = base::lower(name);
  if (n == "hierarchical") return Algorithm::hierarchical;
  if (n == "automatic") return Algorithm::automatic;
  for (int i = 0; i < kNumAlgorithms; ++i)
    if (n == to_string(static_cast<Algorithm>(i))) return static_cast<Algorithm>(i);
  return std::nullopt;
}

}  // namespace braid
