// Shared by the libFuzzer targets (tests/fuzz/fuzz_*.cpp; docs/reliability.md, "Fuzzing").
//
// A target feeds its input to a parser of the library as the production code would hand
// it bytes from outside the process, and checks what a parser must guarantee whatever the
// bytes: no crash, no undefined behaviour, no leak (the sanitizers see those), no
// allocation sized by an unchecked field (libFuzzer's -malloc_limit_mb), and the
// properties named by FUZZ_CHECK (a failed one aborts, which libFuzzer reports as a crash).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#define FUZZ_CHECK(cond)                                                                   \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "%s:%d: fuzz property failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

namespace fuzz {

/// Reads the input front to back; past the end it yields zeros and empty spans.
class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : p_(data), n_(size) {}
  std::size_t left() const { return n_; }
  const std::uint8_t* here() const { return p_; }
  std::uint8_t byte() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  /// Up to `want` bytes (fewer at the end), advancing past them.
  std::size_t take(std::size_t want, const std::uint8_t** at) {
    const std::size_t k = want < n_ ? want : n_;
    *at = p_;
    p_ += k;
    n_ -= k;
    return k;
  }
  std::string rest() {
    std::string s(reinterpret_cast<const char*>(p_), n_);
    p_ += n_;
    n_ = 0;
    return s;
  }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
};

}  // namespace fuzz
