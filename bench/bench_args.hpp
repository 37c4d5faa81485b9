// Helpers shared by the benches and braid_sim, so that all of them read sizes the same
// way, take the same sweep flags and print the same rows and summary (nccl-tests
// style).
#pragma once

#include <CLI/CLI.hpp>

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>

namespace braid::bench {

/// "1024", "64K", "8M", "1G" (binary multiples) -> bytes. Throws CLI::ValidationError
/// with the accepted forms on anything else.
inline std::uint64_t parse_size(const std::string& s) {
  const auto bad = [&] { return CLI::ValidationError("size", "'" + s + "' is not a size like 1024, 64K, 8M, 1G"); };
  if (s.empty()) throw bad();
  std::uint64_t mult = 1;
  std::string d = s;
  switch (std::toupper(static_cast<unsigned char>(d.back()))) {
    case 'K': mult = 1ull << 10; d.pop_back(); break;
    case 'M': mult = 1ull << 20; d.pop_back(); break;
    case 'G': mult = 1ull << 30; d.pop_back(); break;
    default: break;
  }
  if (d.empty() || d.find_first_not_of("0123456789") != std::string::npos || d.size() > 15) throw bad();
  return std::stoull(d) * mult;
}

/// nccl-tests' size sweep and iteration flags, with its defaults: every bench takes
/// them (collective_args.hpp adds the rest for collective_bench).
struct SweepFlags {
  std::string minb = "1K", maxb = "64M";
  double factor = 2;
  int iters = 20, warmup = 5, check = 1;
};

/// Adds -b, -e, -f, -n, -w and -c to `app`, stored into `o`.
inline void add_sweep_flags(CLI::App& app, SweepFlags& o) {
  app.add_option("-b,--minbytes", o.minb, "smallest size in bytes (K/M/G suffixes)")->capture_default_str();
  app.add_option("-e,--maxbytes", o.maxb, "largest size in bytes")->capture_default_str();
  app.add_option("-f,--stepfactor", o.factor, "size multiplication factor between sizes")->capture_default_str();
  app.add_option("-n,--iters", o.iters, "timed iterations per size")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup_iters", o.warmup, "warm-up iterations per size")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("-c,--check", o.check, "check results (1) or not (0)")->capture_default_str();
}

/// Reads -b and -e into `lo` and `hi`; returns what is wrong with the sweep flags,
/// each followed by "; " ("" when nothing is).
inline std::string read_sweep(const SweepFlags& f, std::size_t* lo, std::size_t* hi) {
  std::string err;
  try {
    *lo = parse_size(f.minb);
    *hi = parse_size(f.maxb);
  } catch (const std::exception& e) {
    err += std::string(e.what()) + "; ";
  }
  if (f.factor <= 1.0) err += "-f must be > 1; ";
  if (*hi < *lo) err += "-e must be >= -b; ";
  return err;
}

/// One size's measurement in one layout (out of place or in place).
struct SweepResult {
  double time_us = 0, algbw = 0, busbw = 0;
  long long wrong = -1;  ///< elements out of bounds; -1: not checked
};

/// The #wrong column: the count, or N/A when it was not checked.
inline std::string wrong_text(long long w) { return w < 0 ? std::string("N/A") : std::to_string(w); }

/// Rank 0's table row for one size (out of place, then in place), and the same values
/// as a CSV row when `csv` is open.
inline void print_sweep_row(std::size_t count, std::size_t es, const std::string& type, const std::string& op,
                            const SweepResult (&res)[2], std::ofstream& csv) {
  std::printf(" %12zu %12zu %8s %6s %10.1f %8.3f %8.3f %6s %10.1f %8.3f %8.3f %6s\n", count * es, count, type.c_str(),
              op.c_str(), res[0].time_us, res[0].algbw, res[0].busbw, wrong_text(res[0].wrong).c_str(),
              res[1].time_us, res[1].algbw, res[1].busbw, wrong_text(res[1].wrong).c_str());
  std::fflush(stdout);
  if (csv)
    csv << count * es << ',' << count << ',' << type << ',' << op << ',' << res[0].time_us << ',' << res[0].algbw
        << ',' << res[0].busbw << ',' << res[0].wrong << ',' << res[1].time_us << ',' << res[1].algbw << ','
        << res[1].busbw << ',' << res[1].wrong << '\n';
}

/// The closing lines of a sweep (rank 0): values out of bounds and the average bus
/// bandwidth over the sizes.
inline void print_sweep_summary(long long total_wrong, double busbw_sum, int nsizes) {
  std::printf("# Out of bounds values : %lld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
  std::printf("# Avg bus bandwidth    : %.3f GB/s\n#\n", nsizes ? busbw_sum / nsizes : 0.0);
}

}  // namespace braid::bench
