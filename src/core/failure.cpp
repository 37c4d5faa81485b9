// Failure records through the store, bounded (see failure.hpp for the records and the rules).
#include "core/failure.hpp"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <climits>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <system_error>
#include <thread>
#include <vector>

namespace braid::core {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

// A rank number written by a peer (untrusted text): -1 unless it is a decimal int >= -1.
int parse_rank(const std::string& s) {
  int v = -1;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (r.ec != std::errc() || v < -1) return -1;
  return v;
}

// The listening sockets' inodes on TCP port `port` in this network namespace.
std::set<std::string> listening_inodes(unsigned port) {
  std::set<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
      if (!(ls >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >> timeout >> inode)) continue;
      if (st != "0A") continue;  // TCP_LISTEN
      const auto colon = local.rfind(':');
      if (colon == std::string::npos) continue;
      unsigned p = 0;
      const char* b = local.data() + colon + 1;
      const auto r = std::from_chars(b, local.data() + local.size(), p, 16);
      if (r.ec == std::errc() && p == port) out.insert(inode);
    }
  }
  return out;
}

}  // namespace

bool serves_store(const Store& store) noexcept {
  try {
    const auto* tcp = dynamic_cast<const TcpStore*>(&store);
    if (tcp == nullptr) return false;
    const std::set<std::string> inodes = listening_inodes(tcp->port());
    if (inodes.empty()) return false;
    bool found = false;
    if (DIR* d = ::opendir("/proc/self/fd")) {
      while (const dirent* e = ::readdir(d)) {
        char link[64] = {};
        const std::string path = std::string("/proc/self/fd/") + e->d_name;
        const ssize_t n = ::readlink(path.c_str(), link, sizeof link - 1);
        if (n <= 0) continue;
        const std::string target(link, static_cast<std::size_t>(n));  // "socket:[12345]"
        if (target.rfind("socket:[", 0) == 0 && target.back() == ']' &&
            inodes.count(target.substr(8, target.size() - 9))) {
          found = true;
          break;
        }
      }
      ::closedir(d);
    }
    return found;
  } catch (const std::exception&) {
    return false;
  }
}

struct FailureBoard::Shared {
  std::shared_ptr<Store> store;
  int rank = 0;
  milliseconds budget{1000};
  std::atomic<int> host{-1};
  std::atomic<bool> learning{false};

  std::mutex mu;
  // A call that passed its wait and has not returned yet: the store is silent while it is
  // there, and no other call is started (they would only stack up behind it).
  std::shared_ptr<void> stuck;
  milliseconds stuck_after{0};
  std::string failed;  // what the last call that returned threw ("" after a success)

  // Runs `fn` on a thread of its own and waits for it until `until`; empty when it did not
  // finish by then (it goes on and clears the silence when it returns), threw (`failed`
  // says what), or the store is already known to be silent.
  template <class T>
  std::optional<T> bounded(Clock::time_point until, std::function<T(Store&)> fn) {
    struct Call {
      std::mutex mu;
      std::condition_variable cv;
      bool done = false;
      std::optional<T> value;
    };
    auto call = std::make_shared<Call>();
    const auto started = Clock::now();
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stuck) return std::nullopt;
    }
    std::shared_ptr<Shared> self = self_.lock();
    try {
      std::thread([self, call, fn = std::move(fn)] {
        std::optional<T> v;
        std::string err;
        try {
          v = fn(*self->store);
        } catch (const std::exception& e) {
          err = e.what();
        }
        {
          std::lock_guard<std::mutex> lock(self->mu);
          self->failed = err;
          if (self->stuck == call) self->stuck.reset();
        }
        std::lock_guard<std::mutex> lock(call->mu);
        call->value = std::move(v);
        call->done = true;
        call->cv.notify_all();
      }).detach();
    } catch (const std::system_error& e) {
      std::lock_guard<std::mutex> lock(mu);
      failed = std::string("no thread to ask it: ") + e.what();
      return std::nullopt;
    }
    std::unique_lock<std::mutex> wait(call->mu);
    if (call->cv.wait_until(wait, until, [&] { return call->done; })) return std::move(call->value);
    wait.unlock();
    std::lock_guard<std::mutex> lock(mu);
    std::lock_guard<std::mutex> again(call->mu);  // it may have finished in between
    if (call->done) return std::move(call->value);
    stuck = call;
    stuck_after = std::chrono::duration_cast<milliseconds>(Clock::now() - started);
    return std::nullopt;
  }

  std::string silence() {
    std::lock_guard<std::mutex> lock(mu);
    const int h = host.load();
    const std::string who = h >= 0 && h != rank ? ", served by rank " + std::to_string(h) + "'s process," : "";
    if (stuck)
      return "the store" + who + " has not answered within " + std::to_string(stuck_after.count()) + " ms";
    if (!failed.empty()) return "the store" + who + " failed: " + failed;
    return "";
  }

  std::weak_ptr<Shared> self_;
};

FailureBoard::FailureBoard(std::shared_ptr<Store> store, int rank, milliseconds budget)
    : s_(std::make_shared<Shared>()) {
  s_->store = std::move(store);
  s_->rank = rank;
  s_->budget = budget;
  s_->self_ = s_;
}

FailureBoard::~FailureBoard() = default;

void FailureBoard::claim_store_host() {
  s_->store->set("store_host", std::to_string(s_->rank));
  s_->host = s_->rank;
}

void FailureBoard::learn_store_host() noexcept {
  if (s_->host.load() >= 0 || s_->learning.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (s_->stuck) {
      s_->learning = false;
      return;
    }
  }
  try {
    std::thread([s = s_] {
      try {
        if (s->store->check({"store_host"})) s->host = parse_rank(s->store->get("store_host", milliseconds(1000)));
      } catch (const std::exception&) {
      }
      s->learning = false;
    }).detach();
  } catch (const std::system_error&) {
    s_->learning = false;
  }
}

int FailureBoard::store_host() const noexcept { return s_->host.load(); }

std::string FailureBoard::store_silence() const { return s_->silence(); }

void FailureBoard::publish_failure(int blame, const std::string& reason) noexcept {
  try {
    const int rank = s_->rank;
    s_->bounded<bool>(Clock::now() + s_->budget, [=](Store& st) {
      st.set("abort/" + std::to_string(rank), std::to_string(blame) + "\n" + reason);
      // And under the rank it blames, for ranks that are still setting up a connection to
      // it and would otherwise wait for it until their deadline (peer_gone).
      if (blame >= 0 && blame != rank) st.set("blamed/" + std::to_string(blame), reason);
      return true;
    });
  } catch (const std::exception&) {
  }
}

void FailureBoard::publish_leaving(const std::string& sentence) noexcept {
  try {
    const int rank = s_->rank;
    s_->bounded<bool>(Clock::now() + milliseconds(200), [=](Store& st) {
      st.set("left/" + std::to_string(rank), sentence);
      return true;
    });
  } catch (const std::exception&) {
  }
}

PeerRecord FailureBoard::record_of(int peer) noexcept {
  PeerRecord out;
  try {
    const std::string p = std::to_string(peer);
    auto got = s_->bounded<PeerRecord>(Clock::now() + s_->budget, [p](Store& st) {
      PeerRecord r;
      // The record is written before the connections close, so it is there by now if the
      // peer failed on its own; a peer that died leaves none. Do not wait.
      if (st.check({"abort/" + p})) {
        const std::string rec = st.get("abort/" + p, milliseconds(1000));
        const auto nl = rec.find('\n');
        r.kind = PeerRecord::Kind::failed;
        r.blame = nl == std::string::npos ? -1 : parse_rank(rec.substr(0, nl));
        r.text = nl == std::string::npos ? rec : rec.substr(nl + 1);
        return r;
      }
      if (st.check({"left/" + p})) {
        r.kind = PeerRecord::Kind::left;
        r.text = st.get("left/" + p, milliseconds(1000));
        return r;
      }
      r.kind = PeerRecord::Kind::none;
      return r;
    });
    if (got) return *got;
    out.text = s_->silence();
  } catch (const std::exception& e) {
    out.text = e.what();
  }
  return out;
}

std::optional<std::string> FailureBoard::peer_gone(int peer) noexcept {
  try {
    const std::string p = std::to_string(peer);
    auto got = s_->bounded<std::optional<std::string>>(Clock::now() + s_->budget,
                                                       [p](Store& st) -> std::optional<std::string> {
      const auto read = [&](const std::string& key) -> std::optional<std::string> {
        if (!st.check({key})) return std::nullopt;
        return st.get(key, milliseconds(1000));
      };
      if (const auto v = read("abort/" + p)) return "rank " + p + " failed: " + v->substr(v->find('\n') + 1);
      if (const auto v = read("blamed/" + p)) return "rank " + p + " was found dead by a peer: " + *v;
      return read("left/" + p);
    });
    if (got) return *got;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

namespace {

// The store side of follow_stalls, on the bounded call's thread.
StallVerdict chase_stalls(Store& store, int rank, std::uint64_t seq, int first, Clock::time_point until,
                          milliseconds grace) {
  StallVerdict v;
  store.set("stall/" + std::to_string(rank), std::to_string(seq) + "\n" + std::to_string(first));
  if (first < 0) return v;
  std::vector<int> chain{rank, first};
  std::map<int, std::string> calls;  // ranks met in another call than this rank's: that call's number
  for (;;) {
    const int p = chain.back();
    std::optional<std::string> rec;
    const std::string key = "stall/" + std::to_string(p);
    while (!rec && Clock::now() < until) {
      if (store.check({key})) {
        rec = store.get(key, milliseconds(1000));
      } else {
        std::this_thread::sleep_for(milliseconds(10));
      }
    }
    if (!rec && store.check({"abort/" + std::to_string(p)})) return v;  // it failed on its own: its report says why
    if (!rec && store.check({"left/" + std::to_string(p)})) {
      const std::string left = store.get("left/" + std::to_string(p), milliseconds(1000));
      std::ostringstream lo;
      if (chain.size() > 2) {
        lo << " Following the waits:";
        for (std::size_t i = 1; i + 1 < chain.size(); ++i) lo << " rank " << chain[i] << " waits on rank " << chain[i + 1] << ";";
      }
      lo << " " << left << ": it is not calling this collective.";
      v.blame = p;
      v.text = lo.str();
      return v;
    }
    std::ostringstream os;
    auto waits = [&](std::size_t from) {
      for (std::size_t i = from; i + 1 < chain.size(); ++i) {
        os << " rank " << chain[i];
        if (calls.count(chain[i])) os << " (in its call #" << calls[chain[i]] << ")";
        os << " waits on rank " << chain[i + 1] << ";";
      }
    };
    if (!rec) {
      if (chain.size() == 2) {
        os << " Rank " << p;
      } else {
        os << " Following the waits:";
        waits(1);
        os << " rank " << p;
      }
      os << " has not reported a timeout of its own within " << grace.count()
         << " ms: it is the likely cause (stopped, hung outside braid, or not calling this collective).";
      v.blame = p;
      v.no_record = true;
      v.text = os.str();
      return v;
    }
    const auto nl = rec->find('\n');
    const std::string their_seq = rec->substr(0, nl);
    const int next = nl == std::string::npos ? -1 : parse_rank(rec->substr(nl + 1));
    // A rank may be a call ahead (it finished its part of the previous one) or behind: the
    // wait is followed all the same.
    if (their_seq != std::to_string(seq)) calls[p] = their_seq;
    if (next < 0 || next == p) return v;
    if (std::find(chain.begin(), chain.end(), next) != chain.end()) {
      chain.push_back(next);
      os << " The waits form a cycle:";
      waits(0);
      os << " no rank is silent: the ranks may disagree about the call (different collectives, counts or roots;"
            " BRAID_CHECK_ARGS=1 names them), or the call is slower than its deadline.";
      v.text = os.str();
      return v;
    }
    chain.push_back(next);
  }
}

}  // namespace

StallVerdict FailureBoard::follow_stalls(std::uint64_t seq, int first, milliseconds grace) noexcept {
  StallVerdict v;
  try {
    const auto until = Clock::now() + grace;
    const int rank = s_->rank;
    auto got = s_->bounded<StallVerdict>(until + milliseconds(200), [=](Store& st) {
      return chase_stalls(st, rank, seq, first, until, grace);
    });
    if (got) return *got;
    v.store_silence = s_->silence();
  } catch (const std::exception& e) {
    v.store_silence = e.what();
  }
  return v;
}

}  // namespace braid::core
