#include "core/job_secret.hpp"

#include "base/check.hpp"
#include "base/text.hpp"

#include <braid/error.hpp>

#include <charconv>
#include <random>

namespace braid::core {
namespace {

std::uint64_t random_u64() {
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace

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
  const auto nl = meta.find('\n');
  const char* first = meta.data();
  const char* end = meta.data() + (nl == std::string::npos ? 0 : nl);
  const auto [ptr, ec] = std::from_chars(first, end, s.comm_id, 16);
  const std::string rest = nl == std::string::npos ? std::string() : meta.substr(nl + 1);
  const bool made = rest.rfind("token ", 0) == 0 && rest.size() > 6;
  BRAID_CHECK(nl != std::string::npos && nl > 0 && nl <= 16 && ec == std::errc() && ptr == end &&
                  (made || rest == "given"),
              Network,
              "rank " << rank << ": the communicator record in the store (key 'meta') is malformed ("
                      << meta.size() << " bytes); is another program using this store's address?");
  if (made) {
    BRAID_CHECK(token.empty(), InvalidUsage,
                "rank " << rank << " was given BRAID_AUTH_TOKEN but rank 0 was not; set the same token on every "
                                   "rank, or on none");
    s.token = rest.substr(6);
  } else {
    BRAID_CHECK(!token.empty(), InvalidUsage,
                "rank 0 was given BRAID_AUTH_TOKEN but rank " << rank
                                                            << " was not; set the same token on every rank, or on none");
    s.token = token;
  }
  return s;
}

}  // namespace braid::core
