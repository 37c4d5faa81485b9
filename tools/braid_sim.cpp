// braid_sim: prices braid's plans on a modelled cluster far larger than this machine.
//
//   braid_sim                                   # all-reduce, 8..1024 GPUs, 8 per host
//   braid_sim -r 16,256 -b 4K -e 256M -f 4 -a ring,tree
//   braid_sim --intra nvlink --intra-bw 390 --inter ib --inter-bw 50 --nic-per-host 0
//   braid_sim --intra pcie -r 4,8                # GPUs joined by PCIe, no NVLink
//
// For every world size it builds the plans of all ranks with build_plan, simulates
// them with the α-β-γ cost model (src/collectives/cost.hpp, docs/cost-model.md) and
// prints, per message size, each algorithm's predicted time and bus bandwidth
// (nccl-tests' definitions, so the columns compare with all_reduce_perf), then the
// size from which the ring beats each other algorithm, per world size.
#include "collectives/cost.hpp"
#include "collectives/plan.hpp"
#include "collectives/tuner.hpp"

#include <braid/error.hpp>
#include <braid/types.hpp>

#include <CLI/CLI.hpp>

#include "bench_args.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using braid::bench::parse_size;

using namespace braid::collectives;
using braid::Algorithm;

// "8,16,1024" or "8-1024" (doubling from 8 up to 1024), combinable: "2,8-64,1000".
std::vector<int> parse_ranks(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto dash = item.find('-');
    try {
      if (dash == std::string::npos) {
        out.push_back(std::stoi(item));
      } else {
        const int lo = std::stoi(item.substr(0, dash)), hi = std::stoi(item.substr(dash + 1));
        if (lo < 1 || hi < lo) throw CLI::ValidationError("ranks", "bad range '" + item + "'");
        for (long long n = lo; n <= hi; n *= 2) out.push_back(static_cast<int>(n));
      }
    } catch (const std::logic_error&) {
      throw CLI::ValidationError("ranks", "'" + item + "' is not a number or a range like 8-1024");
    }
  }
  for (int n : out)
    if (n < 1) throw CLI::ValidationError("ranks", "world sizes must be >= 1");
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::optional<LinkClass> parse_link(const std::string& s) {
  for (int c = 0; c < kNumLinkClasses; ++c)
    if (s == to_string(static_cast<LinkClass>(c))) return static_cast<LinkClass>(c);
  return std::nullopt;
}

std::optional<Collective> parse_collective(const std::string& s) {
  for (int c = 0; c <= static_cast<int>(Collective::alltoall); ++c)
    if (s == to_string(static_cast<Collective>(c))) return static_cast<Collective>(c);
  return std::nullopt;
}

// Every algorithm of the enum but automatic.
std::vector<Algorithm> all_algorithms() {
  std::vector<Algorithm> v;
  for (int a = 1; a < braid::kNumAlgorithms; ++a) v.push_back(static_cast<Algorithm>(a));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"braid_sim: predicted time and bus bandwidth of braid's plans on a modelled cluster (α-β-γ cost model, "
               "discrete-event simulation of every rank's plan). See docs/cost-model.md."};
  std::string ranks_s = "8-1024", minb = "1K", maxb = "1G", coll_s = "allreduce", algos_s = "all", dname = "float",
              oname = "sum", csv, slice_s = "512K";
  std::string intra_s = "nvlink", inter_s = "ib";
  // Bandwidths and latencies 0: the link class's default (CostModel::defaults()).
  double factor = 2, intra_bw = 0, intra_us = 0, inter_bw = 0, inter_us = 0, nic_bw = 0, reduce_bw = 1000,
         copy_bw = 1500;
  int per_host = 8, jobs = 1;
  std::uint64_t max_steps = 1ull << 23;
  app.add_option("-r,--ranks", ranks_s, "world sizes: list (8,16,64) and/or doubling ranges (8-1024)")->capture_default_str();
  app.add_option("-p,--ranks-per-host", per_host, "ranks (GPUs) per host; ranks r..r+p-1 share a host")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("-b,--minbytes", minb, "smallest size in bytes (K/M/G suffixes)")->capture_default_str();
  app.add_option("-e,--maxbytes", maxb, "largest size in bytes")->capture_default_str();
  app.add_option("-f,--stepfactor", factor, "size multiplication factor between sizes")->capture_default_str();
  app.add_option("-c,--collective", coll_s, "allreduce, broadcast, reduce, allgather, reduce_scatter, alltoall")->capture_default_str();
  app.add_option("-a,--algos", algos_s, "comma-separated algorithms (ring,tree,rhd,hier) or all")->capture_default_str();
  app.add_option("-d,--datatype", dname, "element type (float, half, bfloat16, double, ...)")->capture_default_str();
  app.add_option("-o,--op", oname, "sum, prod, min, max, avg")->capture_default_str();
  app.add_option("--intra", intra_s, "link class inside a host: nvlink, pcie, shm, tcp, ib")->capture_default_str();
  app.add_option("--intra-bw", intra_bw,
                 "intra-host bandwidth per rank per direction, GB/s (0: the class's default, docs/cost-model.md; "
                 "nvlink 390, what an H100's NVLink4 copy achieves of its 450)")
      ->capture_default_str();
  app.add_option("--intra-alpha", intra_us, "intra-host latency per message, us (0: the class's default)")->capture_default_str();
  app.add_option("--inter", inter_s, "link class between hosts: ib, tcp, nvlink, pcie, shm")->capture_default_str();
  app.add_option("--inter-bw", inter_bw, "inter-host bandwidth per rank per direction, GB/s (0: the class's default; ib 50, a 400 Gb/s NIC)")->capture_default_str();
  app.add_option("--inter-alpha", inter_us, "inter-host latency per message, us (0: the class's default)")->capture_default_str();
  app.add_option("--nic-per-host", nic_bw, "when > 0: one NIC of this many GB/s per host shared by its ranks (0: a NIC per rank)")->capture_default_str();
  app.add_option("--reduce-bw", reduce_bw, "reduction rate per rank, GB/s of output (GPU: HBM-bound)")->capture_default_str();
  app.add_option("--copy-bw", copy_bw, "local copy rate per rank, GB/s")->capture_default_str();
  app.add_option("--slice", slice_s, "pipeline slice (BRAID_CHUNK_BYTES)")->capture_default_str();
  app.add_option("--max-steps", max_steps, "bound on simulated steps per prediction; slices grow beyond it")->capture_default_str();
  app.add_option("-j,--jobs", jobs, "predictions run at once (threads; a 1024-rank one takes up to ~400 MB)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--csv", csv, "also write one row per (ranks, size, algorithm) to this CSV file");
  CLI11_PARSE(app, argc, argv);

  std::vector<int> worlds;
  std::uint64_t lo = 0, hi = 0, slice = 0;
  try {
    worlds = parse_ranks(ranks_s);
    lo = parse_size(minb);
    hi = parse_size(maxb);
    slice = parse_size(slice_s);
  } catch (const std::exception& e) {
    std::cerr << "braid_sim: " << e.what() << "\n";
    return 2;
  }
  const auto coll = parse_collective(coll_s);
  const auto dtype = braid::parse_dtype(dname);
  const auto op = braid::parse_op(oname);
  const auto intra = parse_link(intra_s), inter = parse_link(inter_s);
  std::vector<Algorithm> algos;
  std::string bad;
  if (algos_s == "all") {
    algos = all_algorithms();
  } else {
    std::stringstream ss(algos_s);
    std::string a;
    while (std::getline(ss, a, ',')) {
      const auto p = braid::parse_algorithm(a);
      if (!p || *p == Algorithm::automatic) bad += "unknown algorithm '" + a + "'; ";
      else algos.push_back(*p);
    }
  }
  if (!coll) bad += "unknown collective '" + coll_s + "'; ";
  if (!dtype) bad += "unknown datatype '" + dname + "'; ";
  if (!op) bad += "unknown op '" + oname + "'; ";
  if (!intra || !inter) bad += "link classes are nvlink, pcie, shm, tcp, ib; ";
  if (intra && inter) {
    // 0: the class's default constants.
    const CostModel d = CostModel::defaults();
    if (intra_bw == 0) intra_bw = 1e-9 / d[*intra].beta;
    if (intra_us == 0) intra_us = d[*intra].alpha * 1e6;
    if (inter_bw == 0) inter_bw = 1e-9 / d[*inter].beta;
    if (inter_us == 0) inter_us = d[*inter].alpha * 1e6;
  }
  if (intra && inter && *intra == *inter && (intra_bw != inter_bw || intra_us != inter_us))
    bad += "--intra and --inter name the same class with different constants; ";
  if (factor <= 1) bad += "-f must be > 1; ";
  if (hi < lo || lo == 0) bad += "need 0 < -b <= -e; ";
  if (intra_bw <= 0 || inter_bw <= 0 || reduce_bw <= 0 || copy_bw <= 0 || slice == 0) bad += "bandwidths and --slice must be > 0; ";
  if (!bad.empty()) {
    std::cerr << "braid_sim: bad arguments: " << bad << "\n";
    return 2;
  }

  CostModel model = CostModel::defaults();
  model[*intra] = {intra_us * 1e-6, 1.0 / (intra_bw * 1e9), model[*intra].eager};
  model[*inter] = {inter_us * 1e-6, 1.0 / (inter_bw * 1e9), model[*inter].eager};
  model.gamma = 1.0 / (reduce_bw * 1e9);
  model.copy_beta = 1.0 / (copy_bw * 1e9);
  const std::size_t es = braid::dtype_size(*dtype);

  std::vector<std::uint64_t> sizes;
  for (double s = static_cast<double>(lo); s <= static_cast<double>(hi) * (1 + 1e-9); s *= factor)
    sizes.push_back(static_cast<std::uint64_t>(std::llround(s)));

  std::ofstream csvf;
  if (!csv.empty()) {
    csvf.open(csv);
    if (!csvf) {
      std::cerr << "braid_sim: cannot write " << csv << "\n";
      return 1;
    }
    csvf << "ranks,hosts,collective,algorithm,size_B,count,time_us,algbw_GBps,busbw_GBps,slice_B,steps\n";
  }

  std::printf("# braid_sim: %s, %s, op %s; %d ranks per host; intra %s %.4g GB/s %.3g us; inter %s %.4g GB/s %.3g us%s; "
              "reduce %.4g GB/s; slice %s\n",
              coll_s.c_str(), dname.c_str(), oname.c_str(), per_host, intra_s.c_str(), intra_bw, intra_us,
              inter_s.c_str(), inter_bw, inter_us,
              nic_bw > 0 ? (", NIC " + std::to_string(nic_bw) + " GB/s per host").c_str() : ", a NIC per rank",
              reduce_bw, format_bytes(static_cast<double>(slice)).c_str());
  const auto t_start = std::chrono::steady_clock::now();

  // Per world: time per (algorithm index, size index), NaN when not offered.
  struct WorldResult {
    int world = 0, hosts = 0;
    std::vector<Algorithm> offered;
    std::vector<double> bytes;           // [size]: nccl-tests' size actually priced
    std::vector<std::vector<double>> t;  // [algo][size]
  };
  std::vector<WorldResult> results;

  for (int world : worlds) {
    const Topology topo = Topology::hosts(world, per_host, *intra, *inter, nic_bw * 1e9);
    WorldResult wr;
    wr.world = world;
    wr.hosts = topo.num_hosts();
    std::vector<std::string> unavailable;
    for (Algorithm a : algos) {
      PlanRequest probe(*coll, world, std::max<std::uint64_t>(1, lo / es), es, *op);
      probe.algorithm = a;
      probe.slice_bytes = slice;
      probe.host_of = std::make_shared<const std::vector<int>>(topo.host_of);
      try {
        if (build_plan(probe)->request.algorithm != a) throw braid::Error(braid::ErrorCode::Unsupported, "alias");
        wr.offered.push_back(a);
      } catch (const braid::Error&) {
        unavailable.push_back(std::string(braid::to_string(a)));
      }
    }
    std::printf("#\n# %d ranks on %d host%s", world, wr.hosts, wr.hosts == 1 ? "" : "s");
    if (!unavailable.empty()) {
      std::printf(" (not offered by build_plan:");
      for (const auto& u : unavailable) std::printf(" %s", u.c_str());
      std::printf(")");
    }
    std::printf("\n#%12s %12s", "size(B)", "count");
    for (Algorithm a : wr.offered) std::printf(" %11s %9s", (std::string(braid::to_string(a)) + " us").c_str(), "busbw");
    std::printf("  best\n");
    wr.t.resize(wr.offered.size());
    for (auto& row : wr.t) row.assign(sizes.size(), NAN);
    // The requests of this world: nccl-tests' size is count·es for allreduce,
    // count·es·world for allgather, ...: pick the per-rank count that gives -b..-e.
    const double per = size_bytes(*coll, 1, es, world) / static_cast<double>(es);
    std::vector<std::uint64_t> counts(sizes.size());
    for (std::size_t si = 0; si < sizes.size(); ++si)
      counts[si] = static_cast<std::uint64_t>(static_cast<double>(sizes[si] / es) / per);
    wr.bytes.resize(sizes.size());
    for (std::size_t si = 0; si < sizes.size(); ++si) wr.bytes[si] = size_bytes(*coll, counts[si], es, world);

    // Predict every (size, algorithm) of this world, `jobs` at a time.
    const std::size_t ntasks = sizes.size() * wr.offered.size();
    std::vector<Prediction> preds(ntasks);
    std::vector<std::string> errors(ntasks);
    std::atomic<std::size_t> next{0};
    auto worker = [&] {
      for (std::size_t i; (i = next.fetch_add(1)) < ntasks;) {
        PlanRequest req(*coll, world, counts[i / wr.offered.size()], es, *op);
        req.slice_bytes = slice;
        req.algorithm = wr.offered[i % wr.offered.size()];
        SimOptions so;
        so.max_steps = max_steps;
        try {
          preds[i] = simulate(req, topo, model, so);
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
      }
    };
    std::vector<std::thread> pool;
    for (int j = 1; j < jobs; ++j) pool.emplace_back(worker);
    worker();
    for (auto& th : pool) th.join();

    for (std::size_t si = 0; si < sizes.size(); ++si) {
      const double bytes = wr.bytes[si];
      std::printf(" %12.0f %12llu", bytes, static_cast<unsigned long long>(counts[si]));
      double best = INFINITY;
      std::string best_name = "-";
      for (std::size_t ai = 0; ai < wr.offered.size(); ++ai) {
        const std::size_t i = si * wr.offered.size() + ai;
        const std::string name(braid::to_string(wr.offered[ai]));
        if (!errors[i].empty()) {
          std::printf(" %21s", "error");
          std::cerr << "braid_sim: " << name << " at " << world << " ranks, " << bytes << " B: " << errors[i] << "\n";
          continue;
        }
        const Prediction& p = preds[i];
        wr.t[ai][si] = p.seconds;
        const double algbw = p.seconds > 0 ? bytes / p.seconds / 1e9 : 0;
        const double busbw = algbw * bus_factor(*coll, world);
        std::printf(" %11.2f %9.2f", p.seconds * 1e6, busbw);
        if (p.seconds < best) best = p.seconds, best_name = name;
        if (csvf)
          csvf << world << "," << wr.hosts << "," << coll_s << "," << name << "," << static_cast<std::uint64_t>(bytes)
               << "," << counts[si] << "," << p.seconds * 1e6 << "," << algbw << "," << busbw << "," << p.slice_bytes
               << "," << p.steps << "\n";
      }
      std::printf("  %s\n", best_name.c_str());
    }
    std::fflush(stdout);
    results.push_back(std::move(wr));
  }

  // Crossovers: for each world and each algorithm X other than ring, the smallest swept
  // size from which the ring is at least as fast as X at every larger swept size.
  std::vector<Algorithm> others;
  for (Algorithm a : algos)
    if (a != Algorithm::ring) others.push_back(a);
  std::printf("#\n# crossover: size from which ring is at least as fast as ... (\"never\": not up to -e; "
              "\"always\": already at -b)\n#%7s %6s", "ranks", "hosts");
  for (Algorithm a : others) std::printf(" %14s", std::string(braid::to_string(a)).c_str());
  std::printf("\n");
  for (const auto& wr : results) {
    std::printf(" %7d %6d", wr.world, wr.hosts);
    const auto ring_it = std::find(wr.offered.begin(), wr.offered.end(), Algorithm::ring);
    for (Algorithm a : others) {
      const auto it = std::find(wr.offered.begin(), wr.offered.end(), a);
      if (it == wr.offered.end() || ring_it == wr.offered.end()) {
        std::printf(" %14s", "n/a");
        continue;
      }
      const auto& tr = wr.t[static_cast<std::size_t>(ring_it - wr.offered.begin())];
      const auto& tx = wr.t[static_cast<std::size_t>(it - wr.offered.begin())];
      std::size_t from = sizes.size();
      for (std::size_t si = sizes.size(); si-- > 0;) {
        if (std::isnan(tr[si]) || std::isnan(tx[si]) || tr[si] > tx[si]) break;
        from = si;
      }
      std::string cell;
      if (from == sizes.size()) cell = "never";
      else if (from == 0) cell = "always";
      else cell = format_bytes(wr.bytes[from]);
      std::printf(" %14s", cell.c_str());
    }
    std::printf("\n");
  }
  if (others.empty() || results.empty()) std::printf("# (no algorithm to compare the ring with)\n");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  std::printf("# simulated in %.2f s\n", took);
  return 0;
}
