// What the fault tests share (test_faults.cpp, test_shrink.cpp): the collectives a rank
// fails in, and the process's own resources, counted before and after a communicator.
#pragma once

#include "test_support.hpp"

#include <braid/braid.hpp>

#include <dirent.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace braid::test::faults {

// ---------------------------------------------------------------------------
// The collectives a rank fails in.

enum class Op { ring, tree, rhd, hierarchical, codec, codec_hierarchical, broadcast, sendrecv };

inline const char* op_label(Op op) {
  switch (op) {
    case Op::ring: return "ring";
    case Op::tree: return "tree";
    case Op::rhd: return "rhd";
    case Op::hierarchical: return "hierarchical";
    case Op::codec: return "int8";
    case Op::codec_hierarchical: return "int8_hierarchical";
    case Op::broadcast: return "broadcast";
    case Op::sendrecv: return "sendrecv";
  }
  return "?";
}

struct Buffers {
  std::vector<float> x, y;
  explicit Buffers(std::size_t n) : x(n, 1.f), y(n, 0.f) {}
};

// One call of `op` on every rank of `c`, waited for (throws braid::Error). A compressed
// call keeps error feedback under `ef_key` when one is given.
inline void run_op(Communicator& c, Op op, Buffers& b, std::chrono::milliseconds timeout,
                   const std::string& ef_key = {}) {
  const std::size_t n = b.x.size();
  const int r = c.rank(), size = c.size();
  switch (op) {
    case Op::broadcast: {
      BroadcastOptions o;
      o.timeout = timeout;
      c.broadcast(b.x.data(), b.x.data(), n, DataType::f32, o).wait();
      return;
    }
    case Op::sendrecv: {
      P2POptions o;
      o.timeout = timeout;
      Work s = c.send(b.x.data(), n, DataType::f32, (r + 1) % size, o);
      Work v = c.recv(b.y.data(), n, DataType::f32, (r + size - 1) % size, o);
      v.wait();
      s.wait();
      return;
    }
    default: {
      AllreduceOptions o;
      o.timeout = timeout;
      // A compressed all-reduce picks its own plan: hierarchical (compressed between hosts
      // only) when the ranks span hosts.
      o.algorithm = op == Op::ring           ? Algorithm::ring
                    : op == Op::tree         ? Algorithm::tree
                    : op == Op::rhd          ? Algorithm::rhd
                    : op == Op::hierarchical ? Algorithm::hierarchical
                                             : Algorithm::automatic;
      if (op == Op::codec || op == Op::codec_hierarchical) {
        o.codec = "int8";
        if (!ef_key.empty()) o.ef_key = ef_key;
      }
      std::fill(b.x.begin(), b.x.end(), 1.f);  // keeps sums small for the codec
      c.allreduce(b.x.data(), b.x.data(), n, DataType::f32, ReduceOp::sum, o).wait();
      return;
    }
  }
}

// ---------------------------------------------------------------------------
// This process's resources.

inline std::set<std::string> dir_entries(const char* dir, const char* prefix = "") {
  std::set<std::string> out;
  if (DIR* d = ::opendir(dir)) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != ".." && name.rfind(prefix, 0) == 0) out.insert(name);
    }
    ::closedir(d);
  }
  return out;
}
inline int open_fds() { return static_cast<int>(dir_entries("/proc/self/fd").size()) - 1; }  // less opendir's own
inline int threads() { return static_cast<int>(dir_entries("/proc/self/task").size()); }
// The names of this process's threads ("braid-engine, ..."), for a failure message.
inline std::string thread_names() {
  std::string out;
  for (const auto& t : dir_entries("/proc/self/task")) {
    std::ifstream f("/proc/self/task/" + t + "/comm");
    std::string name;
    std::getline(f, name);
    out += (out.empty() ? "" : ", ") + name;
  }
  return out;
}

// The baseline thread count of a forked rank. ThreadSanitizer starts its background thread
// in a forked child, and again at the child's first pthread_create when the parent never made
// a thread (gcc 12): one thread made and joined here puts that second one in the baseline, not
// in braid's count. A joined thread can still be listed in /proc/self/task for a moment: the
// kernel wakes the joiner (clearing the thread's id) before it reaps the task. Counted then,
// the baseline was one too high, and a rank that left nothing behind failed (CI, stop 47:
// "threads() 1, threads0 2"). So this waits for that thread's entry to go first.
inline int baseline_threads() {
  long tid = 0;
  std::thread([&] { tid = ::syscall(SYS_gettid); }).join();
  const std::string entry = "/proc/self/task/" + std::to_string(tid);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5) * kTimeScale;
  while (::access(entry.c_str(), F_OK) == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return threads();
}

inline long long now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Waits until the process is back to `threads0` threads and `fds0` fds, 5 s (x kTimeScale)
// at most. A failed communicator asks the store for its peers' reasons on threads of their
// own, bounded to 1 s each (FailureBoard): give such a thread, on a loaded machine, time to
// hear its answer and end.
inline void settle(int threads0, int fds0) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5) * kTimeScale;
  while ((threads() != threads0 || open_fds() != fds0) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

}  // namespace braid::test::faults
