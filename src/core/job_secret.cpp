#include "core/job_secret.hpp"

#include "base/auth.hpp"
#include "base/check.hpp"
#include "base/text.hpp"

#include <braid/error.hpp>

#include <charconv>
#include <cstring>

namespace braid::core {
namespace {

std::uint64_t random_u64() {
  const std::string b = base::auth::random_bytes(8);
  std::uint64_t v = 0;
  std::memcpy(&v, b.data(), sizeof v);
  return v;
}

}  // namespace

std::optional<MetaRecord> parse_meta(const std::string& meta) {
  const auto nl = meta.find('\n');
  if (nl == std::string::npos || nl == 0 || nl > 16) return std::nullopt;
  MetaRecord r;
  const auto [ptr, ec] = std::from_chars(meta.data(), meta.data() + nl, r.comm_id, 16);
  if (ec != std::errc() || ptr != meta.data() + nl) return std::nullopt;
  const std::string rest = meta.substr(nl + 1);
  if (rest == "given") {
    r.given = true;
    return r;
  }
  // A token rank 0 made: 32 hex digits (as it makes them); anything else is not its record.
  if (rest.size() != 6 + 32 || rest.compare(0, 6, "token ") != 0 ||
      rest.find_first_not_of("0123456789abcdef", 6) != std::string::npos)
    return std::nullopt;
  r.token = rest.substr(6);
  return r;
}

JobSecret share_secret(Store& store, int rank, const std::string& token, std::chrono::milliseconds timeout) {
  JobSecret s;
  if (rank == 0) {
    s.comm_id = random_u64();
    if (token.empty()) {
      s.token = base::hex16(random_u64()) + base::hex16(random_u64());
      store.set("meta", base::hex(s.comm_id) + "\ntoken " + s.token);
    } else {
      s.token = token;
      store.set("meta", base::hex(s.comm_id) + "\ngiven");
    }
    return s;
  }
  const std::string meta = store.get("meta", timeout);
  const std::optional<MetaRecord> rec = parse_meta(meta);
  BRAID_CHECK(rec.has_value(), Network,
              "rank " << rank << ": the communicator record in the store (key 'meta') is malformed ("
                      << meta.size() << " bytes); is another program using this store's address?");
  s.comm_id = rec->comm_id;
  const bool made = !rec->given;
  if (made) {
    BRAID_CHECK(token.empty(), InvalidUsage,
                "rank " << rank << " was given BRAID_AUTH_TOKEN but rank 0 was not; set the same token on every "
                                   "rank, or on none");
    s.token = rec->token;
  } else {
    BRAID_CHECK(!token.empty(), InvalidUsage,
                "rank 0 was given BRAID_AUTH_TOKEN but rank " << rank
                                                            << " was not; set the same token on every rank, or on none");
    s.token = token;
  }
  return s;
}

}  // namespace braid::core
