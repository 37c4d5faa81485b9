#include "transport_harness.hpp"

#include "test_support.hpp"

#include "base/settings.hpp"
#include "transport/registry.hpp"

#include <braid/error.hpp>

#include <dirent.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

namespace braid::test {

using namespace std::chrono_literals;

void MemDirectory::publish(int rank, const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> g(mu_);
    map_[{rank, key}] = value;
  }
  cv_.notify_all();
}

std::string MemDirectory::lookup(int rank, const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> g(mu_);
  const auto k = std::make_pair(rank, key);
  if (!cv_.wait_for(g, timeout, [&] { return map_.count(k) > 0; }))
    throw TimeoutError("no '" + key + "' published by rank " + std::to_string(rank));
  return map_[k];
}

std::optional<std::string> RankDirectory::try_lookup(int peer, const std::string& key) {
  try {
    return d_.lookup(peer, key, std::chrono::milliseconds(0));
  } catch (const TimeoutError&) {
    return std::nullopt;
  }
}

void FileDirectory::publish(const std::string& key, const std::string& value) {
  const std::string path = file(rank_, key), tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << value;
  }
  ::rename(tmp.c_str(), path.c_str());
}

std::string FileDirectory::lookup(int peer, const std::string& key, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (auto v = try_lookup(peer, key)) return *v;
    if (Clock::now() >= deadline) throw TimeoutError("no '" + key + "' from rank " + std::to_string(peer));
    std::this_thread::sleep_for(1ms);
  }
}

std::optional<std::string> FileDirectory::try_lookup(int peer, const std::string& key) {
  std::ifstream f(file(peer, key), std::ios::binary);
  if (!f) return std::nullopt;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string FileDirectory::file(int rank, const std::string& key) const {
  return dir_ + "/" + std::to_string(rank) + "." + key;
}

TempDir::TempDir() : path(temp_path("transport")) { ::mkdir(path.c_str(), 0700); }

TempDir::~TempDir() {
  if (DIR* d = ::opendir(path.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
        ::unlink((path + "/" + e->d_name).c_str());
    }
    ::closedir(d);
  }
  ::rmdir(path.c_str());
}

std::uint64_t fresh_comm_id() {
  std::random_device rd;
  return (std::uint64_t{rd()} << 32) ^ rd() ^ static_cast<std::uint64_t>(::getpid());
}

bt::CommonOptions common_options(int rank, int size, std::uint64_t comm_id) {
  bt::CommonOptions o;
  o.rank = rank;
  o.size = size;
  o.auth_token = "transport-test-token";
  o.comm_id = comm_id;
  o.connect_timeout = 10s;
  return o;
}

bool TransportRank::drive(const std::vector<bt::Request*>& reqs, Clock::duration limit, int wait_ms) {
  const auto deadline = Clock::now() + limit;
  for (;;) {
    bool pending = false;
    for (const bt::Request* r : reqs) pending = pending || r->state == State::pending;
    if (!pending) return true;
    if (Clock::now() > deadline) return false;
    step(wait_ms);
  }
}

void TransportRank::handshake(int peer) {
  std::uint32_t v = 1, w = 0;
  bt::Request s, g;
  to(peer)->send(&v, sizeof v, 1, &s);
  to(peer)->recv(&w, sizeof w, 1, &g);
  ASSERT_TRUE(drive({&s, &g}));
  ASSERT_DONE(s);
  ASSERT_DONE(g);
}

void run_thread_ranks(int size, const std::function<bt::CommonOptions(int)>& options, const TransportFactory& make,
                      const std::function<void(TransportRank&)>& fn) {
  MemDirectory dir;
  std::atomic<int> finished{0};
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      auto& error = errors[static_cast<std::size_t>(r)];
      try {
        RankDirectory d(dir, r);
        TransportRank rank(d, options(r), make);
        try {
          fn(rank);
        } catch (...) {
          error = std::current_exception();
        }
        // A rank that bailed out early may have left requests on buffers that are gone:
        // fail them before progressing further.
        if (error || ::testing::Test::HasFailure()) rank.transport->close_all("test failed");
        ++finished;
        const auto deadline = Clock::now() + kTransportDeadline;
        while (finished.load() < size && Clock::now() < deadline) rank.step();
      } catch (...) {
        if (!error) error = std::current_exception();
        ++finished;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

void run_process_ranks(int size, const std::function<bt::CommonOptions(int)>& options, const TransportFactory& make,
                       const std::function<void(TransportRank&)>& fn) {
  TempDir tmp;
  run_processes_ok(
      size,
      [&](int r) {
        FileDirectory d(tmp.path, r);
        TransportRank rank(d, options(r), make);
        fn(rank);
        if (::testing::Test::HasFailure()) rank.transport->close_all("test failed");
        d.publish("done", "1");
        const auto deadline = Clock::now() + kTransportDeadline;
        for (int p = 0; p < size; ++p) {
          while (!d.try_lookup(p, "done") && Clock::now() < deadline) rank.step();
        }
      },
      std::chrono::seconds(120));
}

std::vector<std::uint8_t> pattern(std::size_t n, std::uint64_t seed) {
  std::vector<std::uint8_t> v(n);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t i = 0; i < n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(v.data() + i, &x, std::min<std::size_t>(8, n - i));
  }
  return v;
}

std::size_t fifo_size(int i) {
  if (i % 40 == 1) return std::size_t{8} << 20;
  if (i % 10 == 5) return (std::size_t{1} << 20) + static_cast<std::size_t>(i);
  if (i % 7 == 0) return 0;
  if (i % 3 == 0) return 70000 + static_cast<std::size_t>(i);
  return 1 + static_cast<std::size_t>(i) * 13;
}

void expect_in_order(const std::vector<bt::Request>& reqs, const char* what) {
  bool gap = false;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    if (reqs[i].state == State::pending) {
      gap = true;
    } else if (gap) {
      ADD_FAILURE() << what << " #" << i << " completed before an earlier one";
      return;
    }
  }
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

double thread_cpu_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

bool wait_closed(int fd, Clock::duration limit) {
  const auto deadline = Clock::now() + limit;
  char buf[256];
  while (Clock::now() < deadline) {
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, 50) <= 0) continue;
    const ssize_t r = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return true;
  }
  return false;
}

void expect_impostors_refused(const std::function<std::unique_ptr<TransportRank>(int)>& make_rank,
                              const std::function<int()>& connect_raw, const Impostors& impostors) {
  const auto data = pattern(1000, 77);
  std::atomic<bool> impostors_done{false}, real_peer_started{false};
  bool finished_early = false;
  bt::Request q;
  std::vector<std::uint8_t> in(data.size());
  std::thread t1([&] {
    auto r = make_rank(1);
    r->to(0)->recv(in.data(), in.size(), 3, &q);
    r->drive({&q});
    finished_early = !real_peer_started;
    const auto deadline = Clock::now() + 5s;
    while (!impostors_done && Clock::now() < deadline) r->step();
  });
  for (const auto& imp : impostors) {
    const int fd = connect_raw();
    if (fd < 0) continue;  // connect_raw said why
    EXPECT_EQ(::send(fd, imp.second.data(), imp.second.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(imp.second.size()))
        << imp.first;
    EXPECT_TRUE(wait_closed(fd)) << imp.first << ": the listener did not close the socket";
    ::close(fd);
  }
  real_peer_started = true;
  std::thread t0([&] {
    auto r = make_rank(0);
    bt::Request s;
    r->to(1)->send(data.data(), data.size(), 3, &s);
    ASSERT_TRUE(r->drive({&s}));
    EXPECT_DONE(s);
    impostors_done = true;
    r->step_for(50ms);
  });
  t0.join();
  t1.join();
  EXPECT_FALSE(finished_early) << "an impostor disturbed the real connection: " << q.error;
  EXPECT_DONE(q);
  EXPECT_TRUE(in == data);
}

TransportFactory entry_factory(const std::string& name, std::map<std::string, std::string> rows) {
  return [name, rows](const bt::CommonOptions& o, bt::Poller& poller, bt::PeerDirectory& dir) {
    const bt::TransportEntry* e = bt::find_transport(name);
    if (e == nullptr) throw std::runtime_error("no transport '" + name + "' in this build");
    std::vector<base::Setting> all = e->settings;
    for (const char* lib : {"BRAID_IBVERBS_LIBRARY", "BRAID_UCX_LIBRARY"})
      all.push_back({lib, base::SettingType::text, "", "the library the transport loads"});
    const auto settings = base::Settings::parse(all, [&](const char* row) -> std::optional<std::string> {
      if (const auto it = rows.find(row); it != rows.end()) return it->second;
      if (std::strstr(row, "_LIBRARY") != nullptr) {
        if (const char* v = std::getenv(row)) return std::string(v);
      }
      return std::nullopt;
    });
    bt::TransportContext c;
    c.common = o;
    c.master_addr = "127.0.0.1";
    c.settings = &settings;
    c.poller = &poller;
    c.directory = &dir;
    return e->make(c);
  };
}

}  // namespace braid::test
