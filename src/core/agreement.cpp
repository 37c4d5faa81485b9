// The survivors' agreement on a shrunk communicator's members (agreement.hpp).
#include "core/agreement.hpp"

#include "base/check.hpp"
#include "base/text.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <set>
#include <thread>

namespace braid::core {

std::string format_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ranks[i]);
  }
  return out;
}

bool parse_ranks(const std::string& text, int size, std::vector<int>* out) {
  std::vector<int> ranks;
  if (!text.empty())
    for (const std::string& field : base::split(text, ',')) {
      std::int64_t r = 0;
      if (!base::parse_int64(field, &r) || r < 0 || r >= size) return false;
      ranks.push_back(static_cast<int>(r));
    }
  *out = std::move(ranks);
  return true;
}

namespace {
/// This machine and its pid namespace: "<boot id>\n<pid namespace>". A host id given by
/// hand (BRAID_HOST_ID) may name several machines; the kernel's boot id tells them apart.
std::string this_kernel() {
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  if (!f || !std::getline(f, boot) || boot.empty()) boot = "?";
  char buf[64] = {0};
  const ssize_t n = ::readlink("/proc/self/ns/pid", buf, sizeof buf - 1);
  return boot + "\n" + (n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string("?"));
}
}  // namespace

std::string process_identity(const std::string& host_id) {
  return host_id + "\n" + this_kernel() + "\n" + std::to_string(::getpid());
}

bool process_gone(const std::string& identity, const std::string& host_id) {
  const std::string kernel = this_kernel();
  const std::string mine = host_id + "\n" + kernel + "\n";
  if (kernel.compare(0, 2, "?\n") == 0 || identity.compare(0, mine.size(), mine) != 0) return false;
  std::int64_t pid = 0;
  if (!base::parse_int64(identity.substr(mine.size()), &pid) || pid <= 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!stat || !std::getline(stat, line)) return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
  const auto paren = line.rfind(')');  // "pid (comm) S ...": comm may hold anything
  return paren != std::string::npos && paren + 2 < line.size() && (line[paren + 2] == 'Z' || line[paren + 2] == 'X');
}

std::vector<int> agree_on_members(Store& store, std::uint64_t k, int rank, int size, const std::vector<int>& exclude,
                                  std::chrono::milliseconds timeout, const std::function<bool(int)>& gone_by_probe) {
  using Clock = std::chrono::steady_clock;
  const std::string base = "shrink/" + std::to_string(k) + "/";
  const std::string decision = base + "members";
  const auto key = [&](const char* what, int r) { return base + what + "/" + std::to_string(r); };
  // A store without compare_set is refused now, not after waiting for the others.
  (void)store.compare_set(base + "probe", "", "1");
  // What this rank asks to leave out, before it counts as a caller: a proposer that sees it
  // called sees its exclusions too.
  store.set(key("exclude", rank), format_ranks(exclude));
  store.set(key("alive", rank), "1");

  const auto read_decision = [&](const std::string& v) {
    std::vector<int> members;
    BRAID_CHECK(parse_ranks(v, size, &members) && !members.empty(), Network,
                "shrink: the store's decision '" << v << "' is not a list of ranks; is another program using this store?");
    BRAID_CHECK(std::binary_search(members.begin(), members.end(), rank), Aborted,
                "shrink: the other survivors went on without rank " << rank << " (members " << v
                                                                    << "): it called shrink after they had agreed, "
                                                                       "or one of them excluded it");
    return members;
  };

  const auto deadline = Clock::now() + timeout;
  std::vector<char> called(static_cast<std::size_t>(size), 0), gone(static_cast<std::size_t>(size), 0);
  std::set<int> excluded(exclude.begin(), exclude.end());
  called[static_cast<std::size_t>(rank)] = 1;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (store.check({decision})) return read_decision(store.get(decision, timeout));
    bool waiting = false;
    for (int r = 0; r < size; ++r) {
      const auto i = static_cast<std::size_t>(r);
      if (!called[i] && store.check({key("alive", r)})) {
        called[i] = 1;
        std::vector<int> theirs;
        const std::string v = store.get(key("exclude", r), timeout);
        BRAID_CHECK(parse_ranks(v, size, &theirs), Network,
                    "shrink: rank " << r << "'s exclusions '" << v << "' in the store are not a list of ranks");
        excluded.insert(theirs.begin(), theirs.end());
      }
      if (called[i] || gone[i]) continue;
      const bool blamed = store.check({"blamed/" + std::to_string(r)}) && !store.check({revoked_key(r)});
      if (blamed || (gone_by_probe && gone_by_probe(r))) {
        gone[i] = 1;
        continue;
      }
      waiting = true;
    }
    for (int r : excluded) gone[static_cast<std::size_t>(r)] = 1;
    if (!waiting || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
  std::vector<int> proposal;
  for (int r = 0; r < size; ++r)
    if (called[static_cast<std::size_t>(r)] && !excluded.count(r)) proposal.push_back(r);
  // Other callers' exclusions may leave out every rank this one saw; an empty proposal
  // would read as no decision, so it is not made (this rank is out of it either way).
  BRAID_CHECK(!proposal.empty(), Aborted,
              "shrink: the callers' exclusions leave out every rank that called, rank " << rank << " too");
  return read_decision(store.compare_set(decision, "", format_ranks(proposal)));
}

}  // namespace braid::core
