// The limits FileStore and TcpStore both enforce on keys and values, and the checks that
// report a breach the same way in both: the store and where it lives, the operation,
// the sizes.
#pragma once

#include "base/text.hpp"

#include <braid/error.hpp>

#include <cstddef>
#include <string>

namespace braid::core {

/// Longest key a store accepts, in bytes.
inline constexpr std::size_t kMaxStoreKey = 4096;
/// Largest value a store accepts, in bytes.
inline constexpr std::size_t kMaxStoreValue = std::size_t{64} << 20;

/// Throws Error(InvalidUsage) when `key` is longer than kMaxStoreKey. `store` and
/// `where` name the store in the message ("FileStore", its path).
inline void check_store_key(const char* store, const std::string& where, const std::string& key, const char* op) {
  if (key.size() > kMaxStoreKey)
    throw Error(ErrorCode::InvalidUsage, std::string(store) + " " + where + ": " + op + ": key of " +
                                             std::to_string(key.size()) + " bytes exceeds " +
                                             std::to_string(kMaxStoreKey));
}

/// Throws Error(InvalidUsage) when `value`, to be set under `key`, is larger than
/// kMaxStoreValue.
inline void check_store_value(const char* store, const std::string& where, const std::string& key,
                              const std::string& value) {
  if (value.size() > kMaxStoreValue)
    throw Error(ErrorCode::InvalidUsage, std::string(store) + " " + where + ": set(" + base::quote(key) +
                                             "): value of " + std::to_string(value.size()) + " bytes exceeds " +
                                             std::to_string(kMaxStoreValue));
}

}  // namespace braid::core
