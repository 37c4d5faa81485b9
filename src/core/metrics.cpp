#include "core/metrics.hpp"

#include "base/fd.hpp"
#include "base/logging.hpp"
#include "base/text.hpp"

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

namespace braid::core {

namespace {

/// One writer: a load and a store, no locked read-modify-write.
void bump(std::atomic<std::uint64_t>& c, std::uint64_t by) noexcept {
  c.store(c.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
}

bool same_codec(const compression::CodecSpec& a, const compression::CodecSpec& b) noexcept {
  return a.kind == b.kind && a.block == b.block && a.rounding == b.rounding && a.topk_ratio == b.topk_ratio;
}

}  // namespace

MetricsTable::MetricsTable() : series_(new MetricSeries[kMaxSeries]) {}

MetricSeries& MetricsTable::series(const char* collective, const char* algorithm,
                                   const compression::CodecSpec& codec) {
  auto fits = [&](const MetricSeries& s) {
    return s.collective == collective && s.algorithm == algorithm && same_codec(s.codec, codec);
  };
  if (last_ != nullptr && fits(*last_)) return *last_;
  const std::size_t n = count_.load(std::memory_order_relaxed);
  for (std::size_t i = 0; i < n; ++i)
    if (fits(series_[i])) return *(last_ = &series_[i]);
  if (n == kMaxSeries) return *(last_ = &series_[kMaxSeries - 1]);  // "other" (see snapshot)
  MetricSeries& s = series_[n];
  s.collective = collective;
  s.algorithm = algorithm;
  s.codec = codec;
  s.codec_name = codec.kind == compression::CodecKind::none ? "none" : compression::name(codec);
  count_.store(n + 1, std::memory_order_release);  // readers see the labels before the series
  return *(last_ = &s);
}

void MetricsTable::count(MetricSeries& s, std::uint64_t bytes, std::uint64_t wire_bytes, std::chrono::nanoseconds took,
                         bool ok) noexcept {
  if (!ok) {
    bump(s.errors, 1);
    return;
  }
  const auto ns = static_cast<std::uint64_t>(took.count() > 0 ? took.count() : 0);
  bump(s.calls, 1);
  bump(s.bytes, bytes);
  bump(s.wire_bytes, wire_bytes);
  bump(s.nanos, ns);
  // Bucket k: at most 2^k us. us <= 1 -> 0; else the bit length of (us - 1).
  const std::uint64_t us = (ns + 999) / 1000;
  int k = us <= 1 ? 0 : 64 - __builtin_clzll(us - 1);
  if (k >= OperationMetrics::kBuckets) k = OperationMetrics::kBuckets - 1;
  bump(s.histogram[static_cast<std::size_t>(k)], 1);
}

Metrics MetricsTable::snapshot(const std::string& comm, int rank, int size) const {
  Metrics m;
  m.comm = comm;
  m.rank = rank;
  m.size = size;
  const std::size_t n = count_.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i) {
    const MetricSeries& s = series_[i];
    OperationMetrics o;
    const bool other = i == kMaxSeries - 1;
    o.collective = other ? "other" : s.collective;
    o.algorithm = other ? "other" : s.algorithm;
    o.codec = other ? "other" : s.codec_name;
    o.calls = s.calls.load(std::memory_order_relaxed);
    o.errors = s.errors.load(std::memory_order_relaxed);
    o.bytes = s.bytes.load(std::memory_order_relaxed);
    o.wire_bytes = s.wire_bytes.load(std::memory_order_relaxed);
    o.seconds = static_cast<double>(s.nanos.load(std::memory_order_relaxed)) * 1e-9;
    for (const auto& h : s.histogram) o.histogram.push_back(h.load(std::memory_order_relaxed));
    m.operations.push_back(std::move(o));
  }
  return m;
}

// --- Prometheus text -------------------------------------------------------------------

namespace {

std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string labels(const Metrics& m, const OperationMetrics& o) {
  return "comm=\"" + label_value(m.comm) + "\",rank=\"" + std::to_string(m.rank) + "\",collective=\"" +
         label_value(o.collective) + "\",algorithm=\"" + label_value(o.algorithm) + "\",codec=\"" +
         label_value(o.codec) + "\"";
}

}  // namespace

std::string prometheus_text(const std::vector<Metrics>& all) {
  std::ostringstream os;
  struct Counter {
    const char* name;
    const char* help;
    std::uint64_t OperationMetrics::*field;
  };
  static const Counter counters[] = {
      {"braid_calls_total", "Operations completed.", &OperationMetrics::calls},
      {"braid_errors_total", "Operations failed, timed out or aborted while running.", &OperationMetrics::errors},
      {"braid_bytes_total", "The callers' data of completed operations (count x element size).",
       &OperationMetrics::bytes},
      {"braid_wire_bytes_total", "Bytes this rank sent for completed operations (compressed, for codecs).",
       &OperationMetrics::wire_bytes},
  };
  for (const Counter& c : counters) {
    os << "# HELP " << c.name << " " << c.help << "\n# TYPE " << c.name << " counter\n";
    for (const Metrics& m : all)
      for (const OperationMetrics& o : m.operations) os << c.name << "{" << labels(m, o) << "} " << o.*c.field << "\n";
  }
  os << "# HELP braid_seconds Time of completed operations, from start to completion.\n"
        "# TYPE braid_seconds histogram\n";
  for (const Metrics& m : all) {
    for (const OperationMetrics& o : m.operations) {
      const std::string l = labels(m, o);
      std::uint64_t cumulative = 0;
      for (std::size_t k = 0; k + 1 < o.histogram.size(); ++k) {
        cumulative += o.histogram[k];
        os << "braid_seconds_bucket{" << l << ",le=\"" << static_cast<double>(1ull << k) * 1e-6 << "\"} "
           << cumulative << "\n";
      }
      os << "braid_seconds_bucket{" << l << ",le=\"+Inf\"} " << o.calls << "\n";
      os << "braid_seconds_sum{" << l << "} " << o.seconds << "\n";
      os << "braid_seconds_count{" << l << "} " << o.calls << "\n";
    }
  }
  return os.str();
}

}  // namespace braid::core

std::string braid::Metrics::prometheus() const { return core::prometheus_text({*this}); }

// --- the HTTP endpoint -----------------------------------------------------------------

namespace braid::core {

namespace {

struct Endpoint {
  std::mutex mu;
  std::map<int, std::function<Metrics()>> sources;
  int next = 1;
  int port = -1;  ///< bound, or -1
  bool tried = false;
};

Endpoint& endpoint() {
  static auto* e = new Endpoint;  // NOLINT: the server thread may outlive static destruction
  return *e;
}

void serve(int listen_fd) {
  for (;;) {
    base::UniqueFd c(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (!c) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) continue;
      return;
    }
    timeval tv{1, 0};  // a client that sends nothing does not hold the server
    ::setsockopt(c.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(c.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    char buf[2048];
    std::string req;
    while (req.find("\r\n\r\n") == std::string::npos && req.size() < 16384) {
      const ssize_t n = ::recv(c.get(), buf, sizeof buf, 0);
      if (n <= 0) break;
      req.append(buf, static_cast<std::size_t>(n));
    }
    std::string body, status = "200 OK";
    if (req.rfind("GET ", 0) != 0) {
      status = "405 Method Not Allowed";
      body = "braid metrics: only GET\n";
    } else {
      std::vector<Metrics> all;
      {
        // Under the lock: remove_metrics_source() then waits for a snapshot in progress,
        // so a communicator is never read after it is gone. Snapshots never block.
        Endpoint& e = endpoint();
        std::lock_guard<std::mutex> lock(e.mu);
        for (auto& [h, f] : e.sources) all.push_back(f());
      }
      body = prometheus_text(all);
    }
    const std::string head = "HTTP/1.0 " + status +
                             "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: " +
                             std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
    const std::string out = head + body;
    std::size_t off = 0;
    while (off < out.size()) {
      const ssize_t n = ::send(c.get(), out.data() + off, out.size() - off, MSG_NOSIGNAL);
      if (n <= 0) break;
      off += static_cast<std::size_t>(n);
    }
  }
}

/// Binds 127.0.0.1:port and starts the server thread. Call with e.mu held.
void start(Endpoint& e, int port) {
  e.tried = true;
  base::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int one = 1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (!fd || ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      ::bind(fd.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 || ::listen(fd.get(), 16) != 0) {
    BRAID_LOG(warn, "metrics: cannot serve on 127.0.0.1:" << port << " (BRAID_METRICS_PORT + local rank): "
                                                           << base::errno_text(errno) << "; no metrics endpoint");
    return;
  }
  e.port = port;
  BRAID_LOG(info, "metrics: serving Prometheus text on http://127.0.0.1:" << port << "/metrics");
  std::thread(serve, fd.release()).detach();
}

}  // namespace

int add_metrics_source(int port, std::function<Metrics()> source) {
  if (port <= 0) return -1;
  Endpoint& e = endpoint();
  std::lock_guard<std::mutex> lock(e.mu);
  if (!e.tried) start(e, port);
  if (e.port < 0) return -1;
  if (e.port != port)
    BRAID_LOG(warn, "metrics: this process serves on port " << e.port << " already; a communicator asking for "
                                                            << port << " is served there too");
  const int h = e.next++;
  e.sources.emplace(h, std::move(source));
  return h;
}

void remove_metrics_source(int handle) noexcept {
  if (handle < 0) return;
  Endpoint& e = endpoint();
  std::lock_guard<std::mutex> lock(e.mu);
  e.sources.erase(handle);
}

}  // namespace braid::core
