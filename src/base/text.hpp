// Text helpers for messages and strict parsing, used by every layer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace braid::base {

/// strerror(err) as a std::string, thread-safe.
std::string errno_text(int err);

/// `v` in lowercase hexadecimal, no prefix, no padding ("1f").
std::string hex(std::uint64_t v);

/// `v` as 16 lowercase hexadecimal digits, zero-padded ("000000000000001f").
std::string hex16(std::uint64_t v);

/// `n` bytes from `p` as lowercase hexadecimal, two digits each ("00ff1a").
std::string hex_bytes(const void* p, std::size_t n);

/// The bytes hex_bytes wrote; false (and `*out` unspecified) unless `s` is an even number
/// of lowercase hexadecimal digits.
bool from_hex_bytes(const std::string& s, std::vector<unsigned char>* out);

/// Quotes a key for a message: printable ASCII kept, the rest as \xNN, keys longer than
/// 200 bytes cut with "...".
std::string quote(const std::string& key);

/// Up to 10 quoted keys, comma-separated, then "... (N in all)".
std::string quote_keys(const std::vector<std::string>& keys);

/// `s` in ASCII lowercase.
std::string lower(std::string_view s);

/// The fields of `s` between `sep` characters, empty ones included ("a;;b" -> a, "", b;
/// "" -> one empty field).
std::vector<std::string> split(const std::string& s, char sep);

/// Strict decimal int64: the whole string, optional '-'. False (and *out unspecified)
/// on anything else.
bool parse_int64(const std::string& s, std::int64_t* out);

/// Strict real (strtod's syntax: decimal, hexfloat, inf, nan): the whole string, nothing
/// before or after. False (and *out unspecified) on anything else, "" included.
bool parse_double(const std::string& s, double* out);

}  // namespace braid::base
