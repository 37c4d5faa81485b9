// Typed configuration rows and their one parse.
//
// A Setting is one row of braid's configuration table: a variable's name, its type, its
// default (as text, parsed by the same code as a user's value, so each default is written
// once), its bounds and a help line. core/config.cpp owns the table of the core's rows and
// every transport declares its own rows in its folder (transport/registry.hpp); core joins
// them into one table, parses it once per process into Settings, and generates
// `braid_info --config` and docs/configuration.md from it.
//
// base reads no environment: parse() takes a lookup function.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace braid::base {

enum class SettingType : std::uint8_t {
  text,      ///< any string
  integer,   ///< decimal, within [min, max]; `choices` may name keywords that mean "unset" ("auto")
  bytes,     ///< "512K", "4M", "1G" or a plain count, at least `min`, a multiple of `multiple`
  boolean,   ///< 0/1, true/false, yes/no, on/off
  duration,  ///< "30s", "500ms", "2m", "1h" or plain seconds; positive
  real,      ///< a number within [min, max]
  choice,    ///< one of `choices` ('|'-separated), case-insensitive; kept lowercase
};

/// Name of a type as the docs print it ("bytes", "enum", ...).
const char* to_string(SettingType t) noexcept;

/// One row of the configuration table.
struct Setting {
  std::string name;
  SettingType type = SettingType::text;
  std::string default_value;  ///< "" = no default (unset unless given)
  std::string help;
  /// false for variables another tool defines (RANK, SLURM_PROCID, ...): a malformed value
  /// is reported only when braid uses it, since braid may not.
  bool braid_owned = true;
  double min = 0, max = 0;  ///< integer/real bounds, bytes minimum; max == min == 0: none
  std::string choices;      ///< choice: accepted values; integer: keywords meaning "unset"
  std::size_t multiple = 0; ///< bytes: must be a multiple of this (0: any)
};

/// Every row's value, parsed once. Values of rows that were not given are their defaults.
class Settings {
 public:
  using Lookup = std::function<std::optional<std::string>(const char*)>;
  using Value = std::variant<std::monostate, std::string, std::int64_t, std::size_t, bool,
                             std::chrono::milliseconds, double>;

  /// Parses `rows` from `lookup` (an empty value counts as unset). Throws
  /// braid::Error(InvalidUsage) naming the variable and the accepted form when a braid-owned
  /// value does not parse; a malformed foreign value throws when it is read.
  static Settings parse(const std::vector<Setting>& rows, const Lookup& lookup);

  /// Whether the variable was given (not defaulted).
  bool given(const std::string& name) const;
  /// The value as given, or empty.
  std::string raw(const std::string& name) const;

  // Typed reads. Reading an unknown name or the wrong type is a braid bug (Internal).
  const std::string& text(const std::string& name) const;  ///< text and choice rows
  std::optional<std::int64_t> integer(const std::string& name) const;  ///< unset: nullopt
  std::size_t bytes(const std::string& name) const;
  bool boolean(const std::string& name) const;
  std::chrono::milliseconds duration(const std::string& name) const;
  double real(const std::string& name) const;

 private:
  struct Entry {
    SettingType type = SettingType::text;
    Value value;
    std::string raw;
    bool given = false;
    std::string error;  ///< a foreign row's parse error, thrown when read
  };
  const Entry& at(const std::string& name, SettingType a, SettingType b) const;
  std::map<std::string, Entry> values_;
};

/// Parses "512K", "4M", "1G", "1048576" (binary multiples). Empty on bad input.
std::optional<std::size_t> parse_bytes(const std::string& s);

/// Parses "30s", "500ms", "2m", "1h", or a plain number of seconds. Empty on bad input.
std::optional<std::chrono::milliseconds> parse_duration(const std::string& s);

}  // namespace braid::base
