// Harness of the transport tests: ranks as threads (each with its own Poller and
// transport, over an in-memory PeerDirectory) and as forked processes (separate address
// spaces, a file-backed directory, real deaths by SIGKILL). Used by the conformance suite
// (tests/unit/test_transport_conformance.cpp, every registered transport) and by each
// transport's own tests of what only it has (wire formats, striping, segments).
// Every wait has a deadline.
#pragma once

#include "base/poller.hpp"
#include "transport/transport.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace braid::test {

namespace bt = braid::transport;
using Clock = std::chrono::steady_clock;
using State = bt::Request::State;

constexpr auto kTransportDeadline = std::chrono::seconds(30);

/// A directory of (rank, key) -> value in memory, shared by thread ranks.
class MemDirectory {
 public:
  void publish(int rank, const std::string& key, const std::string& value);
  /// Throws braid::TimeoutError after `timeout`.
  std::string lookup(int rank, const std::string& key, std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<int, std::string>, std::string> map_;
};

/// One rank's view of a MemDirectory.
class RankDirectory : public bt::PeerDirectory {
 public:
  RankDirectory(MemDirectory& d, int rank) : d_(d), rank_(rank) {}
  void publish(const std::string& key, const std::string& value) override { d_.publish(rank_, key, value); }
  std::string lookup(int peer, const std::string& key, std::chrono::milliseconds timeout) override {
    return d_.lookup(peer, key, timeout);
  }
  std::optional<std::string> try_lookup(int peer, const std::string& key) override;

 private:
  MemDirectory& d_;
  int rank_;
};

/// One file per (rank, key) in a directory shared by forked processes.
class FileDirectory final : public bt::PeerDirectory {
 public:
  FileDirectory(std::string dir, int rank) : dir_(std::move(dir)), rank_(rank) {}
  void publish(const std::string& key, const std::string& value) override;
  std::string lookup(int peer, const std::string& key, std::chrono::milliseconds timeout) override;
  std::optional<std::string> try_lookup(int peer, const std::string& key) override;

 private:
  std::string file(int rank, const std::string& key) const;
  std::string dir_;
  int rank_;
};

/// A fresh directory under $TMPDIR, removed with its files.
struct TempDir {
  TempDir();
  ~TempDir();
  std::string path;
};

/// Makes one rank's transport: its common options (rank, size, token, communicator id,
/// connect timeout, on_refused), its poller and its directory.
using TransportFactory =
    std::function<std::unique_ptr<bt::Transport>(const bt::CommonOptions&, bt::Poller&, bt::PeerDirectory&)>;

/// A registered transport made through its entry, as the engine makes it, with `rows` of its
/// configuration set; the loaders' rows (core's BRAID_IBVERBS_LIBRARY and BRAID_UCX_LIBRARY)
/// come from the environment, as for the engine (test_support.cpp points the first at the
/// fakeverbs provider).
TransportFactory entry_factory(const std::string& name, std::map<std::string, std::string> rows = {});

/// What every test rank's transport starts from: a shared token, a communicator id
/// unique to the calling test (so that tests running in parallel never share names), a
/// 10 s connect timeout.
bt::CommonOptions common_options(int rank, int size, std::uint64_t comm_id);
/// A communicator id no other test process uses.
std::uint64_t fresh_comm_id();

/// One rank: a poller and a transport, driven as the engine drives them.
struct TransportRank {
  TransportRank(bt::PeerDirectory& d, const bt::CommonOptions& o, const TransportFactory& make)
      : rank(o.rank), transport(make(o, poller, d)) {}
  virtual ~TransportRank() = default;  // transports' tests derive their Rank from it

  bt::Connection* to(int peer) { return transport->connection(peer); }
  /// What the engine does: progress, and when nothing moved, arm and block briefly.
  void step(int wait_ms = 1) {
    if (transport->progress()) return;
    if (transport->prepare_sleep()) poller.wait(wait_ms);
  }
  /// Progresses until no request in `reqs` is pending; false when the deadline passes.
  bool drive(const std::vector<bt::Request*>& reqs, Clock::duration limit = kTransportDeadline, int wait_ms = 1);
  void step_for(Clock::duration d) {
    const auto until = Clock::now() + d;
    while (Clock::now() < until) step();
  }
  /// Sends and receives a small message each way so that the connection to `peer` is up.
  void handshake(int peer);

  int rank;
  bt::Poller poller;
  std::unique_ptr<bt::Transport> transport;
};

/// Runs fn on `size` ranks as threads over one MemDirectory; `options(rank)` gives each
/// rank's options. A rank that returns keeps progressing until every rank has returned,
/// so that peers can finish; a rank that failed closes its transport first. Rethrows the
/// first exception.
void run_thread_ranks(int size, const std::function<bt::CommonOptions(int)>& options, const TransportFactory& make,
                      const std::function<void(TransportRank&)>& fn);
/// The same with forked processes over a FileDirectory; a child that did not exit 0
/// fails the test.
void run_process_ranks(int size, const std::function<bt::CommonOptions(int)>& options, const TransportFactory& make,
                       const std::function<void(TransportRank&)>& fn);

/// True once the other end of socket `fd` has closed it (EOF or an error); false when it
/// is still open after `limit`.
bool wait_closed(int fd, Clock::duration limit = std::chrono::seconds(5));

/// Bytes an impostor sends to a listener, after what they are (for failure messages).
using Impostors = std::vector<std::pair<const char*, std::string>>;
/// Proves that a transport's listener refuses impostors without disturbing the real
/// peer: rank 1 (`make_rank(1)`) posts a receive from rank 0; each impostor connects
/// (`connect_raw()`, a socket to rank 1's published address), sends its bytes and must
/// see the socket closed; then rank 0 (`make_rank(0)`) connects and sends, and its
/// message must complete the receive intact, which no impostor may have done before.
void expect_impostors_refused(const std::function<std::unique_ptr<TransportRank>(int)>& make_rank,
                              const std::function<int()>& connect_raw, const Impostors& impostors);

/// `n` bytes of a pseudo-random pattern determined by `seed`.
std::vector<std::uint8_t> pattern(std::size_t n, std::uint64_t seed);
/// Message sizes of the FIFO tests: 0, small, 64 KiB-ish, 1 MiB and 8 MiB mixed.
std::size_t fifo_size(int i);
/// Fails the test when a later request completed before an earlier one.
void expect_in_order(const std::vector<bt::Request>& reqs, const char* what);
bool contains(const std::string& s, const std::string& part);
/// CPU time of the calling thread.
double thread_cpu_ms();
double ms_since(Clock::time_point t0);

#define EXPECT_DONE(req) EXPECT_EQ((req).state, ::braid::test::State::done) << "error: " << (req).error
#define ASSERT_DONE(req) ASSERT_EQ((req).state, ::braid::test::State::done) << "error: " << (req).error

}  // namespace braid::test
