// Configuration from the environment: every BRAID_* variable and the launchers' variables
// through core::Config::parse (the table's typed rows), and the specs parsed from them
// (the codec of BRAID_CODEC, BRAID_IB_HCA, the GID policy). Input: "NAME=VALUE" lines. A
// value that does not parse must give braid::Error (InvalidUsage) naming the variable, never
// another exception, a crash or an allocation sized by a number in it.
#include "fuzz_common.hpp"

#include "compression/codec.hpp"
#include "core/config.hpp"
#include "transport/ibverbs/ibv_config.hpp"

#include <braid/error.hpp>

#include <map>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string> env;
  std::size_t at = 0;
  while (at < text.size() && env.size() < 64) {
    std::size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(at, nl - at);
    at = nl + 1;
    const auto eq = line.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  const auto lookup = [&](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  try {
    const braid::core::Config c = braid::core::Config::parse(lookup);
    FUZZ_CHECK(c.timeout.count() >= 0);
  } catch (const braid::Error& e) {
    FUZZ_CHECK(e.code() == braid::ErrorCode::InvalidUsage);
  }
  // The specs whose text comes straight from a variable.
  for (const char* name : {"BRAID_CODEC", "BRAID_IB_HCA", "BRAID_IB_ADDR_RANGE"}) {
    auto it = env.find(name);
    if (it == env.end()) continue;
    try {
      if (std::string(name) == "BRAID_CODEC") {
        const braid::compression::CodecSpec s = braid::compression::parse_codec(it->second);
        const std::string n = braid::compression::name(s);
        FUZZ_CHECK(braid::compression::name(braid::compression::parse_codec(n)) == n);
      } else if (std::string(name) == "BRAID_IB_HCA") {
        (void)braid::transport::ibverbs::parse_hca(it->second);
      } else {
        (void)braid::transport::ibverbs::parse_gid_policy(-1, "", it->second, 0);
      }
    } catch (const braid::Error& e) {
      FUZZ_CHECK(e.code() == braid::ErrorCode::InvalidUsage);
    }
  }
  return 0;
}
