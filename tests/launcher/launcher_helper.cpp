// A rank program for braidrun's tests. Its behaviour depends on its rank, which it
// takes from BRAID_RANK in `environ` (braid's house rule keeps getenv out of here).
//
//   env OUTDIR                 write the whole environment to OUTDIR/env.<rank>
//   fail-one R CODE DIR        rank R waits until every other rank wrote DIR/pid.<rank>,
//                              then exits CODE; the others write their pid file and sleep
//   hang DIR [ignore-term]     write DIR/pid.<rank> and sleep (optionally ignoring SIGTERM)
//   print                      two full lines and a partial line on stdout, one full and
//                              one partial on stderr
//   flood LINES                LINES numbered lines on stdout, in uneven write sizes
//   count-signals DIR          write DIR/pid.<rank>, wait for SIGINT/SIGTERM, keep
//                              counting for 500 ms, write the count to DIR/count.<rank>, exit 0
//   selfkill R SIG             rank R kills itself with signal SIG, the others sleep
//   exit CODE                  exit with CODE
#include "rank_env.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using launcher_test::env;

int rank() { return std::atoi(env("BRAID_RANK").c_str()); }
int world() { return std::atoi(env("BRAID_WORLD_SIZE").c_str()); }

// Writes atomically (temp file + rename) so readers never see a partial file.
void write_file(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << text;
  }
  std::rename(tmp.c_str(), path.c_str());
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

void write_pid(const std::string& dir) {
  write_file(dir + "/pid." + std::to_string(rank()), std::to_string(::getpid()) + "\n");
}

[[noreturn]] void sleep_forever() {
  for (;;) ::pause();
}

volatile sig_atomic_t g_count = 0;
extern "C" void count_signal(int) { g_count = g_count + 1; }

int usage() {
  std::fprintf(stderr, "launcher_helper: bad arguments\n");
  return 99;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string mode = argv[1];
  const int r = rank();

  if (mode == "env" && argc == 3) {
    std::vector<std::string> lines;
    for (char** e = environ; *e; ++e) lines.emplace_back(*e);
    std::sort(lines.begin(), lines.end());
    std::string text;
    for (const auto& l : lines) text += l + "\n";
    write_file(std::string(argv[2]) + "/env." + std::to_string(r), text);
    return 0;
  }
  if (mode == "fail-one" && argc == 5) {
    const int fail_rank = std::atoi(argv[2]);
    const std::string dir = argv[4];
    if (r != fail_rank) {
      write_pid(dir);
      sleep_forever();
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (int q = 0; q < world(); ++q) {
      if (q == fail_rank) continue;
      while (!exists(dir + "/pid." + std::to_string(q))) {
        if (std::chrono::steady_clock::now() > deadline) return 98;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    std::fprintf(stderr, "rank %d failing on purpose\n", r);
    return std::atoi(argv[3]);
  }
  if (mode == "hang" && (argc == 3 || argc == 4)) {
    if (argc == 4 && std::string(argv[3]) == "ignore-term") std::signal(SIGTERM, SIG_IGN);
    write_pid(argv[2]);
    sleep_forever();
  }
  if (mode == "print" && argc == 2) {
    std::printf("out line 1\nout line 2\nout partial");
    std::fflush(stdout);
    std::fprintf(stderr, "err line 1\nerr partial");
    return 0;
  }
  if (mode == "flood" && argc == 3) {
    const int lines = std::atoi(argv[2]);
    std::string buf;
    for (int i = 0; i < lines; ++i) {
      buf += "rank " + std::to_string(r) + " line " + std::to_string(i) + " " +
             std::string(static_cast<std::size_t>(i % 97), 'x') + "\n";
      // Uneven writes, often ending mid-line, to exercise reassembly.
      if (buf.size() > static_cast<std::size_t>(100 + (i * 37) % 5000)) {
        std::size_t cut = buf.size() - static_cast<std::size_t>(i % 13);
        std::fwrite(buf.data(), 1, cut, stdout);
        std::fflush(stdout);
        buf.erase(0, cut);
      }
    }
    std::fwrite(buf.data(), 1, buf.size(), stdout);
    return 0;
  }
  if (mode == "count-signals" && argc == 3) {
    struct sigaction sa {};
    sa.sa_handler = count_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    write_pid(argv[2]);
    while (g_count == 0) ::pause();
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    while (std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    write_file(std::string(argv[2]) + "/count." + std::to_string(r), std::to_string(g_count) + "\n");
    return 0;
  }
  if (mode == "selfkill" && argc == 4) {
    if (r == std::atoi(argv[2])) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      ::kill(::getpid(), std::atoi(argv[3]));
    }
    sleep_forever();
  }
  if (mode == "exit" && argc == 3) return std::atoi(argv[2]);
  return usage();
}
