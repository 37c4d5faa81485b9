#include "base/text.hpp"

#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <system_error>

namespace braid::base {
namespace {
// strerror_r is the XSI (int) or the GNU (char*) variant depending on the C library.
inline const char* pick_strerror(int r, const char* buf) { return r == 0 ? buf : "unknown error"; }
inline const char* pick_strerror(const char* r, const char*) { return r; }
}  // namespace

std::string errno_text(int err) {
  char buf[256];
  return pick_strerror(strerror_r(err, buf, sizeof buf), buf);
}

std::string hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string hex16(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

namespace {
const char* const kDigits = "0123456789abcdef";
}  // namespace

std::string hex_bytes(const void* p, std::size_t n) {
  std::string out;
  out.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = static_cast<const unsigned char*>(p)[i];
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

bool from_hex_bytes(const std::string& s, std::vector<unsigned char>* out) {
  if (s.size() % 2 != 0) return false;
  auto v = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  out->clear();
  for (std::size_t i = 0; i < s.size(); i += 2) {
    const int a = v(s[i]), b = v(s[i + 1]);
    if (a < 0 || b < 0) return false;
    out->push_back(static_cast<unsigned char>(a * 16 + b));
  }
  return true;
}

std::string quote(const std::string& key) {
  const char* digits = kDigits;
  std::string out = "'";
  for (std::size_t i = 0; i < key.size() && i < 200; ++i) {
    auto c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += digits[c >> 4];
      out += digits[c & 15];
    }
  }
  if (key.size() > 200) out += "...";
  return out + "'";
}

std::string quote_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (std::size_t i = 0; i < keys.size() && i < 10; ++i) out += (i ? ", " : "") + quote(keys[i]);
  if (keys.size() > 10) out += ", ... (" + std::to_string(keys.size()) + " in all)";
  return out;
}

bool parse_int64(const std::string& s, std::int64_t* out) {
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto r = std::from_chars(s.data(), end, *out);
  return r.ec == std::errc() && r.ptr == end;
}

bool parse_double(const std::string& s, double* out) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return false;
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out(1);
  for (char ch : s) {
    if (ch == sep) out.emplace_back();
    else out.back() += ch;
  }
  return out;
}

}  // namespace braid::base
