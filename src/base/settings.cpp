// Typed configuration rows: one parser for users' values and the table's defaults.
#include "base/settings.hpp"

#include "base/text.hpp"

#include <braid/error.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <sstream>

namespace braid::base {

namespace {


// A row's '|'-separated choices (or an integer's keywords); none for an empty string.
std::vector<std::string> split_choices(const std::string& s) {
  if (s.empty()) return {};
  return split(s, '|');
}

// Whether `text` is one of the '|'-separated `choices`, ignoring case.
bool is_one_of(const std::string& choices, const std::string& text) {
  const std::string l = lower(text);
  for (const auto& c : split_choices(choices))
    if (lower(c) == l) return true;
  return false;
}

// "a, b or c"
std::string spell_choices(const std::vector<std::string>& cs) {
  std::string out;
  for (std::size_t i = 0; i < cs.size(); ++i) {
    if (i > 0) out += i + 1 == cs.size() ? " or " : ", ";
    out += cs[i];
  }
  return out;
}

std::string number(double v) {
  std::ostringstream os;
  os << std::fixed;
  os.precision(v == static_cast<double>(static_cast<long long>(v)) ? 0 : 6);
  os << v;
  return os.str();
}

std::string bad_message(const std::string& name, const std::string& value, const std::string& expected) {
  return name + "='" + value + "' is not valid: expected " + expected + " (see docs/configuration.md)";
}

/// Parses `text` as `row` says; on failure returns false with what was expected.
bool parse_value(const Setting& row, const std::string& text, Settings::Value* out, std::string* expected) {
  switch (row.type) {
    case SettingType::text:
      *out = text;
      return true;
    case SettingType::choice: {
      if (is_one_of(row.choices, text)) {
        *out = lower(text);
        return true;
      }
      *expected = spell_choices(split_choices(row.choices));
      return false;
    }
    case SettingType::integer: {
      const auto keywords = split_choices(row.choices);
      if (is_one_of(row.choices, text)) {  // a keyword such as "auto": unset
        *out = std::monostate{};
        return true;
      }
      const double lo = row.min, hi = row.max == row.min ? 9.2e18 : row.max;
      *expected = "an integer in [" + number(lo) + ", " + number(hi) + "]";
      if (!keywords.empty()) *expected += " or " + spell_choices(keywords);
      if (text.empty()) return false;
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(text.c_str(), &end, 10);
      if (errno != 0 || end == text.c_str() || *end != '\0') return false;
      if (static_cast<double>(v) < lo || static_cast<double>(v) > hi) return false;
      *out = static_cast<std::int64_t>(v);
      return true;
    }
    case SettingType::bytes: {
      const auto b = parse_bytes(text);
      *expected = "a byte count such as 65536, 512K, 4M or 1G";
      if (row.multiple > 1) *expected = "a byte count that is a multiple of " + std::to_string(row.multiple);
      if (row.min > 0) *expected += ", at least " + number(row.min);
      if (!b || static_cast<double>(*b) < row.min || (row.multiple > 1 && *b % row.multiple != 0)) return false;
      *out = *b;
      return true;
    }
    case SettingType::boolean: {
      const std::string l = lower(text);
      *expected = "0/1, true/false, yes/no or on/off";
      if (l == "1" || l == "true" || l == "yes" || l == "on") *out = true;
      else if (l == "0" || l == "false" || l == "no" || l == "off") *out = false;
      else return false;
      return true;
    }
    case SettingType::duration: {
      const auto d = parse_duration(text);
      *expected = "a positive duration such as 30 (seconds), 30s, 500ms, 5m or 1h";
      if (!d || d->count() <= 0) return false;
      *out = *d;
      return true;
    }
    case SettingType::real: {
      char* end = nullptr;
      const double d = std::strtod(text.c_str(), &end);
      *expected = "a number in [" + number(row.min) + ", " + number(row.max) + "]";
      if (text.empty() || end == text.c_str() || *end != '\0' || !(d >= row.min && d <= row.max)) return false;
      *out = d;
      return true;
    }
  }
  return false;
}

}  // namespace

const char* to_string(SettingType t) noexcept {
  switch (t) {
    case SettingType::text: return "string";
    case SettingType::integer: return "int";
    case SettingType::bytes: return "bytes";
    case SettingType::boolean: return "bool";
    case SettingType::duration: return "duration";
    case SettingType::real: return "float";
    case SettingType::choice: return "enum";
  }
  return "?";
}

Settings Settings::parse(const std::vector<Setting>& rows, const Lookup& lookup) {
  Settings s;
  for (const Setting& row : rows) {
    Entry e;
    e.type = row.type;
    auto given = lookup(row.name.c_str());
    if (given && given->empty()) given.reset();  // VAR= counts as unset
    if (!row.default_value.empty()) {
      std::string expected;
      if (!parse_value(row, row.default_value, &e.value, &expected))
        throw Error(ErrorCode::Internal, "the default of " + row.name + " ('" + row.default_value +
                                             "') does not parse as " + expected);
    }
    if (given) {
      e.raw = *given;
      e.given = true;
      Value v;
      std::string expected;
      if (parse_value(row, *given, &v, &expected)) {
        e.value = std::move(v);
      } else {
        const std::string msg = bad_message(row.name, *given, expected);
        if (row.braid_owned) throw Error(ErrorCode::InvalidUsage, msg);
        e.error = msg;
      }
    }
    if (!s.values_.emplace(row.name, std::move(e)).second)
      throw Error(ErrorCode::Internal, "configuration variable " + row.name + " is declared twice");
  }
  return s;
}

const Settings::Entry& Settings::at(const std::string& name, SettingType a, SettingType b) const {
  const auto it = values_.find(name);
  if (it == values_.end()) throw Error(ErrorCode::Internal, "configuration variable " + name + " is not in the table");
  if (it->second.type != a && it->second.type != b)
    throw Error(ErrorCode::Internal, "configuration variable " + name + " read as the wrong type");
  if (!it->second.error.empty()) throw Error(ErrorCode::InvalidUsage, it->second.error);
  return it->second;
}

bool Settings::given(const std::string& name) const {
  const auto it = values_.find(name);
  return it != values_.end() && it->second.given;
}

std::string Settings::raw(const std::string& name) const {
  const auto it = values_.find(name);
  return it == values_.end() ? std::string() : it->second.raw;
}

const std::string& Settings::text(const std::string& name) const {
  static const std::string empty;
  const Entry& e = at(name, SettingType::text, SettingType::choice);
  const auto* s = std::get_if<std::string>(&e.value);
  return s ? *s : empty;
}

std::optional<std::int64_t> Settings::integer(const std::string& name) const {
  const Entry& e = at(name, SettingType::integer, SettingType::integer);
  if (const auto* v = std::get_if<std::int64_t>(&e.value)) return *v;
  return std::nullopt;
}

std::size_t Settings::bytes(const std::string& name) const {
  const Entry& e = at(name, SettingType::bytes, SettingType::bytes);
  const auto* v = std::get_if<std::size_t>(&e.value);
  return v ? *v : 0;
}

bool Settings::boolean(const std::string& name) const {
  const Entry& e = at(name, SettingType::boolean, SettingType::boolean);
  const auto* v = std::get_if<bool>(&e.value);
  return v != nullptr && *v;
}

std::chrono::milliseconds Settings::duration(const std::string& name) const {
  const Entry& e = at(name, SettingType::duration, SettingType::duration);
  const auto* v = std::get_if<std::chrono::milliseconds>(&e.value);
  return v ? *v : std::chrono::milliseconds(0);
}

double Settings::real(const std::string& name) const {
  const Entry& e = at(name, SettingType::real, SettingType::real);
  const auto* v = std::get_if<double>(&e.value);
  return v ? *v : 0.0;
}

std::optional<std::size_t> parse_bytes(const std::string& s) {
  if (s.empty()) return std::nullopt;
  std::size_t mult = 1;
  std::string digits = s;
  const char last = static_cast<char>(std::toupper(static_cast<unsigned char>(s.back())));
  if (last == 'B' && s.size() > 1) digits.pop_back();
  const char unit = digits.empty() ? '\0' : static_cast<char>(std::toupper(static_cast<unsigned char>(digits.back())));
  if (unit == 'K') mult = 1ull << 10;
  else if (unit == 'M') mult = 1ull << 20;
  else if (unit == 'G') mult = 1ull << 30;
  else if (unit == 'T') mult = 1ull << 40;
  if (mult != 1) digits.pop_back();
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); }))
    return std::nullopt;
  errno = 0;
  const unsigned long long v = std::strtoull(digits.c_str(), nullptr, 10);
  if (errno != 0 || v > std::numeric_limits<std::size_t>::max() / mult) return std::nullopt;
  return static_cast<std::size_t>(v * mult);
}

std::optional<std::chrono::milliseconds> parse_duration(const std::string& s) {
  std::size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return std::nullopt;
  char* end = nullptr;
  const std::string num = s.substr(0, i);
  const double v = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size() || v < 0) return std::nullopt;
  const std::string unit = lower(s.substr(i));
  double ms = 0;
  if (unit.empty() || unit == "s") ms = v * 1000;
  else if (unit == "ms") ms = v;
  else if (unit == "us") ms = v / 1000;
  else if (unit == "m" || unit == "min") ms = v * 60'000;
  else if (unit == "h") ms = v * 3'600'000;
  else return std::nullopt;
  if (ms > 1e15) return std::nullopt;
  return std::chrono::milliseconds(static_cast<long long>(ms + 0.5));
}

}  // namespace braid::base
