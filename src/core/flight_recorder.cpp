#include "core/flight_recorder.hpp"

#include "base/check.hpp"
#include "base/logging.hpp"
#include "base/text.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

namespace braid::core {

TraceEntry::Codec& TraceEntry::Codec::operator=(const compression::CodecSpec& c) noexcept {
  kind = c.kind;
  rounding = c.rounding;
  block = static_cast<std::uint16_t>(c.block);
  topk_ratio = static_cast<float>(c.topk_ratio);
  seed = c.seed;
  return *this;
}

compression::CodecSpec TraceEntry::Codec::spec() const noexcept {
  compression::CodecSpec c;
  c.kind = kind;
  c.rounding = rounding;
  c.block = block;
  c.topk_ratio = topk_ratio;
  c.seed = seed;
  return c;
}

void TraceEntry::set_call(const std::string& name) noexcept {
  const std::size_t n = std::min(name.find(" #"), name.size());
  if (n < kCallBytes) {
    std::memcpy(call, name.data(), n);
    call[n] = '\0';
    return;
  }
  std::memcpy(call, name.data(), kCallBytes - 4);
  std::memcpy(call + kCallBytes - 4, "...", 4);
}

std::string TraceEntry::name() const {
  std::string n = call;
  if (task) return n + " #" + std::to_string(seq);
  if (p2p_seq > 0)
    return n + " #" + std::to_string(p2p_seq) + " (" + std::to_string(count) + " x " + std::string(to_string(dtype)) +
           ") " + (n == "send" ? "to" : "from") + " rank " + std::to_string(root);
  return n + " #" + std::to_string(seq) + " (" + algorithm + ", " + std::to_string(count) + " x " +
         std::string(to_string(dtype)) + ", " + std::string(to_string(op)) + ")";
}

void FlightRecorder::keep_ended(TraceRecord r) {
  if (ring_.empty()) return;
  if (ended_.size() >= kKeptEnded) {
    ++ended_not_kept_;
    return;
  }
  ended_.push_back(std::move(r));
}

void FlightRecorder::for_each(const std::function<void(const TraceRecord&)>& f) const {
  const std::size_t n = ring_.size();
  if (n == 0) return;
  const std::uint64_t kept = recorded_ < n ? recorded_ : n;
  TraceRecord r;
  for (std::uint64_t k = recorded_ - kept; k < recorded_; ++k) {
    const TraceEntry& e = ring_[static_cast<std::size_t>(k % n)];
    r.state = TraceRecord::State::done;
    r.seq = e.seq;
    r.p2p_seq = e.p2p_seq;
    r.task = e.task;
    r.algorithm = e.algorithm;
    r.name = e.name();
    r.count = e.count;
    r.dtype = e.dtype;
    r.op = e.op;
    r.root = e.root;
    r.codec = e.codec.spec();
    r.bytes_sent = e.bytes_sent;
    r.started = e.started;
    r.ended = e.ended;
    f(r);
  }
  for (const TraceRecord& x : ended_) f(x);
}

namespace {

using Clock = std::chrono::steady_clock;

/// `s` as a JSON string literal.
void json_string(std::ostream& os, std::string_view s) {
  static const char* digits = "0123456789abcdef";
  os << '"';
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': os << "\\\""; break;
      case '\\': os << "\\\\"; break;
      case '\n': os << "\\n"; break;
      case '\t': os << "\\t"; break;
      default:
        if (c < 0x20) os << "\\u00" << digits[c >> 4] << digits[c & 15];
        else os << ch;
    }
  }
  os << '"';
}

const char* state_name(TraceRecord::State s) {
  switch (s) {
    case TraceRecord::State::done: return "done";
    case TraceRecord::State::failed: return "failed";
    case TraceRecord::State::running: return "running";
    case TraceRecord::State::queued: return "queued";
    case TraceRecord::State::not_run: return "not_run";
  }
  return "?";
}

/// Steady-clock times as microseconds of wall-clock time, so that the ranks' dumps line up
/// (as well as their hosts' clocks agree).
struct WallClock {
  Clock::time_point steady = Clock::now();
  std::chrono::system_clock::time_point wall = std::chrono::system_clock::now();
  long long us(Clock::time_point t) const {
    return std::chrono::duration_cast<std::chrono::microseconds>((wall - (steady - t)).time_since_epoch()).count();
  }
};

void write_record(std::ostream& os, const TraceRecord& r, const WallClock& clock) {
  os << "{\"state\":\"" << state_name(r.state) << "\",\"seq\":" << r.seq;
  if (r.p2p_seq > 0) os << ",\"p2p_seq\":" << r.p2p_seq;
  os << ",\"call\":";
  // The call is the name's first words: "allreduce #5 (...)", "broadcast (tuner trial) #9 (...)".
  json_string(os, std::string_view(r.name).substr(0, std::min(r.name.find(" #"), r.name.find(" ("))));
  os << ",\"name\":";
  json_string(os, r.name);
  if (!r.task) {
    os << ",\"algorithm\":";
    json_string(os, r.algorithm);
    os << ",\"count\":" << r.count << ",\"dtype\":\"" << to_string(r.dtype) << "\",\"op\":\"" << to_string(r.op)
       << "\",\"root\":" << r.root << ",\"codec\":";
    json_string(os, r.codec.kind == compression::CodecKind::none ? std::string("none") : compression::name(r.codec));
  }
  if (r.state == TraceRecord::State::done) os << ",\"bytes_sent\":" << r.bytes_sent;
  const Clock::time_point unknown{};
  if (r.started != unknown) os << ",\"start_us\":" << clock.us(r.started);
  if (r.ended != unknown) os << ",\"end_us\":" << clock.us(r.ended);
  if (r.started != unknown && r.ended != unknown)
    os << ",\"duration_us\":" << std::chrono::duration_cast<std::chrono::microseconds>(r.ended - r.started).count();
  if (r.state == TraceRecord::State::failed || r.state == TraceRecord::State::running) {
    os << ",\"steps\":" << r.steps << ",\"steps_done\":" << r.steps_done << ",\"waiting_on\":[";
    bool first = true;
    for (const PeerProgress& p : r.peers) {
      if (p.sends_posted > p.sends_done || p.recvs_posted > p.recvs_done) {
        os << (first ? "" : ",") << p.rank;
        first = false;
      }
    }
    os << "],\"peers\":[";
    first = true;
    for (const PeerProgress& p : r.peers) {
      os << (first ? "" : ",") << "{\"rank\":" << p.rank << ",\"sends\":" << p.sends
         << ",\"sends_posted\":" << p.sends_posted << ",\"sends_done\":" << p.sends_done << ",\"recvs\":" << p.recvs
         << ",\"recvs_posted\":" << p.recvs_posted << ",\"recvs_done\":" << p.recvs_done
         << ",\"bytes_to_send\":" << p.bytes_to_send << ",\"bytes_sent\":" << p.bytes_sent
         << ",\"bytes_to_recv\":" << p.bytes_to_recv << ",\"bytes_received\":" << p.bytes_received
         << ",\"next_send_step\":" << p.next_send_step << ",\"next_recv_step\":" << p.next_recv_step << "}";
      first = false;
    }
    os << "]";
  }
  if (!r.error.empty()) {
    os << ",\"error\":";
    json_string(os, r.error);
  }
  os << "}";
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

}  // namespace

std::string trace_json(const TraceHeader& h, const FlightRecorder& recorder, const std::vector<TraceRecord>& live) {
  const WallClock clock;
  std::ostringstream os;
  os << "{\"braid_trace\":1,\"rank\":" << h.rank << ",\"size\":" << h.size << ",\"comm\":";
  json_string(os, h.comm);
  os << ",\"comm_id\":\"" << base::hex16(h.comm_id) << "\",\"host\":";
  json_string(os, host_name());
  os << ",\"pid\":" << ::getpid() << ",\"time_us\":" << clock.us(clock.steady) << ",\"reason\":";
  json_string(os, h.reason);
  os << ",\"failed\":" << (h.engine_error.empty() ? "false" : "true") << ",\"error\":";
  json_string(os, h.engine_error);
  os << ",\"capacity\":" << recorder.capacity() << ",\"recorded\":" << recorder.recorded()
     << ",\"ended_not_listed\":" << recorder.ended_not_kept() << ",\"links\":" << h.links << ",\"entries\":[\n";
  bool first = true;
  auto one = [&](const TraceRecord& r) {
    if (!first) os << ",\n";
    first = false;
    write_record(os, r, clock);
  };
  recorder.for_each(one);
  for (const TraceRecord& r : live) one(r);
  os << "\n],\"queued_not_listed\":" << h.queued_more << "}\n";
  return os.str();
}

std::string write_trace(const std::string& dir, const TraceHeader& h, const std::string& json) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    const int err = errno;
    BRAID_CHECK(false, System, "flight recorder: cannot make the directory " << dir << ": " << base::errno_text(err));
  }
  std::string comm;
  for (char c : h.comm) comm += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '_';
  const std::string path =
      dir + "/braid_trace." + comm + "." + base::hex16(h.comm_id) + ".rank" + std::to_string(h.rank) + ".json";
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) {
    const int err = errno;
    BRAID_CHECK(false, System, "flight recorder: cannot write " << tmp << ": " << base::errno_text(err));
  }
  const bool ok = std::fwrite(json.data(), 1, json.size(), f) == json.size();
  const int close_rc = std::fclose(f);
  if (!ok || close_rc != 0 || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    BRAID_CHECK(false, System, "flight recorder: cannot write " << path << ": " << base::errno_text(err));
  }
  return path;
}

// --- SIGUSR1 -------------------------------------------------------------------------

namespace {

/// The signal handler writes to an eventfd; a watcher thread reads it and calls the
/// listeners (a handler may do nothing else safely). Made once, never destroyed: the
/// handler may run at any time, exit included.
struct SignalWatch {
  std::mutex mu;
  std::map<int, std::function<void()>> listeners;
  int next = 1;
  bool tried = false;
  int fd = -1;
};

SignalWatch& signal_watch() {
  static auto* w = new SignalWatch;  // NOLINT: lives until exit, see above
  return *w;
}

std::atomic<int> g_signal_fd{-1};

extern "C" void on_dump_signal(int) {
  const int saved = errno;
  const int fd = g_signal_fd.load(std::memory_order_relaxed);
  if (fd >= 0) {
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto n = ::write(fd, &one, sizeof one);
  }
  errno = saved;
}

void watch_loop(int fd) {
  for (;;) {
    std::uint64_t n = 0;
    if (::read(fd, &n, sizeof n) != static_cast<ssize_t>(sizeof n)) {
      if (errno == EINTR) continue;
      return;
    }
    SignalWatch& w = signal_watch();
    std::lock_guard<std::mutex> lock(w.mu);
    for (auto& [handle, f] : w.listeners) f();
  }
}

/// Installs the handler once, if SIGUSR1 still has its default action. Call with w.mu held.
void install_handler(SignalWatch& w) {
  if (w.tried) return;
  w.tried = true;
  struct sigaction old {};
  if (::sigaction(SIGUSR1, nullptr, &old) != 0) return;
  if (old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO) != 0) {
    BRAID_LOG(info, "flight recorder: SIGUSR1 has a handler of the program's; braid leaves it alone (dump with "
                    "Communicator::dump_trace() instead)");
    return;
  }
  w.fd = ::eventfd(0, EFD_CLOEXEC);
  if (w.fd < 0) {
    BRAID_LOG(warn, "flight recorder: no SIGUSR1 dumps: eventfd failed: " << base::errno_text(errno));
    return;
  }
  g_signal_fd.store(w.fd);
  std::thread(watch_loop, w.fd).detach();
  struct sigaction sa {};
  sa.sa_handler = on_dump_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGUSR1, &sa, nullptr);
}

}  // namespace

int add_dump_listener(std::function<void()> on_signal) {
  SignalWatch& w = signal_watch();
  std::lock_guard<std::mutex> lock(w.mu);
  install_handler(w);
  const int h = w.next++;
  w.listeners.emplace(h, std::move(on_signal));
  return h;
}

void remove_dump_listener(int handle) noexcept {
  SignalWatch& w = signal_watch();
  std::lock_guard<std::mutex> lock(w.mu);
  w.listeners.erase(handle);
}

}  // namespace braid::core
