// collective_bench: nccl-tests' sweep for every collective over braid.
//
//   braidrun -n 4 -- collective_bench --coll allgather -b 1K -e 64M -f 2 -c 1
//   braidrun -n 4 -- all_gather_perf -b 1K -e 64M        (installed names, as nccl-tests)
//
// --coll allreduce, allgather, reduce_scatter, broadcast, reduce, alltoall or sendrecv;
// invoked as all_reduce_perf, all_gather_perf, reduce_scatter_perf, broadcast_perf,
// reduce_perf, alltoall_perf or sendrecv_perf it runs that one. Flags and columns are
// nccl-tests' (-b -e -f -n -w -c -d -o -r -z), definitions in collective_perf.hpp;
// mpi_collective_bench is the same sweep over MPI for side-by-side runs. allreduce_bench
// stays the richer all-reduce tool (--algo and --codec side by side).
//
// --device: every collective on device buffers (braid::device::alloc on device local rank
// modulo the device count), issued on one stream per rank, timed until that stream is
// synchronized (stream semantics, as nccl-tests and allreduce_bench --device); fills and
// checks copy through the host. Without a device runtime it prints why and exits 0.
//
// Launch: braidrun, torchrun or srun (Communicator::from_env); under mpirun, when built
// with MPI, through braid::from_mpi as allreduce_bench does.
#include <braid/braid.hpp>
#include <braid/device.hpp>
#ifdef BRAID_BENCH_MPI
#include <braid/mpi.hpp>
#endif

#include <CLI/CLI.hpp>

#include "collective_args.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

namespace {

using namespace braid::bench;

braid::DataType to_braid(Type t) {
  switch (t) {
    case Type::f32: return braid::DataType::f32;
    case Type::f64: return braid::DataType::f64;
    case Type::f16: return braid::DataType::f16;
    case Type::bf16: return braid::DataType::bf16;
    case Type::i8: return braid::DataType::i8;
    case Type::u8: return braid::DataType::u8;
    case Type::i32: return braid::DataType::i32;
    case Type::i64: return braid::DataType::i64;
    case Type::f8e4m3: return braid::DataType::f8e4m3;
    case Type::f8e5m2: return braid::DataType::f8e5m2;
  }
  return braid::DataType::f32;
}

braid::ReduceOp to_braid(Op op) {
  switch (op) {
    case Op::sum: return braid::ReduceOp::sum;
    case Op::prod: return braid::ReduceOp::prod;
    case Op::min: return braid::ReduceOp::min;
    case Op::max: return braid::ReduceOp::max;
    case Op::avg: return braid::ReduceOp::avg;
  }
  return braid::ReduceOp::sum;
}

// --device: this rank's device memory and stream, released on scope exit.
struct DeviceSide {
  int device = -1;
  void* stream = nullptr;
  std::vector<void*> buffers;
  DeviceSide() = default;
  DeviceSide(const DeviceSide&) = delete;
  DeviceSide& operator=(const DeviceSide&) = delete;
  ~DeviceSide() {
    braid::device::destroy_stream(stream);
    for (void* p : buffers) braid::device::free(p);
  }
};

class BraidBackend final : public Backend {
 public:
  /// `dev` non-null: device buffers and `dev`'s stream.
  BraidBackend(braid::Communicator& c, DeviceSide* dev) : c_(c), dev_(dev) {}
  std::byte* device_buffer(int which, std::size_t bytes) override {
    (void)which;
    if (!dev_) return nullptr;
    dev_->buffers.push_back(braid::device::alloc(bytes, dev_->device));
    return static_cast<std::byte*>(dev_->buffers.back());
  }
  void copy(void* dst, const void* src, std::size_t bytes) override { braid::device::copy(dst, src, bytes); }
  std::string memory_note() const override {
    if (!dev_) return "";
    return "device runtime: " + braid::device::runtime() + "; buffers in device memory (rank 0 on device " +
           std::to_string(dev_->device) + "), one stream per rank, time until the stream is synchronized";
  }
  int rank() const override { return c_.rank(); }
  int world() const override { return c_.size(); }
  std::string banner() const override { return "braid " + braid::version(); }
  void barrier() override { c_.barrier().wait(); }
  double max(double v) override {
    c_.allreduce(&v, &v, 1, braid::DataType::f64, braid::ReduceOp::max).wait();
    return v;
  }
  long long sum(long long v) override {
    std::int64_t x = v;
    c_.allreduce(&x, &x, 1, braid::DataType::i64, braid::ReduceOp::sum).wait();
    return x;
  }
  void run(Coll coll, const Layout& l, std::size_t count, const TypeInfo& t, Op op, int root, int iters,
           bool blocking) override {
    const auto dt = to_braid(t.type);
    const auto rop = to_braid(op);
    const int n = c_.size(), r = c_.rank();
    // Every call's options: the stream and memory kind (--device), the root.
    auto with = [&](auto o) {
      if (dev_) {
        o.stream = dev_->stream;
        o.memory = braid::MemoryKind::device;
      }
      return o;
    };
    braid::BroadcastOptions bo = with(braid::BroadcastOptions{});
    bo.root = root;
    braid::ReduceOptions ro = with(braid::ReduceOptions{});
    ro.root = root;
    const auto ao = with(braid::AllreduceOptions{});
    const auto go = with(braid::AllgatherOptions{});
    const auto so = with(braid::ReduceScatterOptions{});
    const auto to = with(braid::AlltoallOptions{});
    const auto po = with(braid::P2POptions{});
    braid::GatherOptions gao = with(braid::GatherOptions{});
    gao.root = root;
    braid::ScatterOptions sco = with(braid::ScatterOptions{});
    sco.root = root;
    std::vector<braid::Work> works;
    for (int it = 0; it < iters; ++it) {
      switch (coll) {
        case Coll::allreduce: works.push_back(c_.allreduce(l.in, l.out, count, dt, rop, ao)); break;
        case Coll::allgather: works.push_back(c_.allgather(l.in, l.out, count, dt, go)); break;
        case Coll::reduce_scatter: works.push_back(c_.reduce_scatter(l.in, l.out, count, dt, rop, so)); break;
        case Coll::alltoall: works.push_back(c_.alltoall(l.in, l.out, count, dt, to)); break;
        case Coll::broadcast: works.push_back(c_.broadcast(l.in, l.out, count, dt, bo)); break;
        case Coll::reduce: works.push_back(c_.reduce(l.in, l.out, count, dt, rop, ro)); break;
        case Coll::gather: works.push_back(c_.gather(l.in, l.out, count, dt, gao)); break;
        case Coll::scatter: works.push_back(c_.scatter(l.in, l.out, count, dt, sco)); break;
        case Coll::allgatherv: works.push_back(c_.allgatherv(l.in, l.out, v_counts(coll, count, n, r), dt, go)); break;
        case Coll::alltoallv: {
          const auto v = v_counts(coll, count, n, r);
          works.push_back(c_.alltoallv(l.in, v, l.out, v, dt, to));
          break;
        }
        case Coll::sendrecv:
          works.push_back(c_.send(l.in, count, dt, (r + 1) % n, po));
          works.push_back(c_.recv(l.out, count, dt, (r + n - 1) % n, po));
          break;
      }
      if (blocking) {
        if (dev_) braid::device::synchronize(dev_->stream);
        for (auto& w : works) w.wait();
        works.clear();
      }
    }
    if (dev_) braid::device::synchronize(dev_->stream);  // stream semantics: the stream is done
    for (auto& w : works) w.wait();                      // (and a failed call throws here)
  }

 private:
  braid::Communicator& c_;
  DeviceSide* dev_;
};

// --device: this rank's device, chosen before the communicator exists (it takes the
// current device) from the launcher's local rank (else its rank), as nccl-tests; and its
// stream. False, after saying why on rank 0, when there is no device runtime.
bool open_device(DeviceSide* dev) {
  const braid::LaunchEnvironment env = braid::launch_environment();
  const int ndev = braid::device::count();
  if (ndev == 0) {
    std::string why;
    try {
      why = braid::device::runtime();
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (env.rank <= 0) std::printf("# collective_bench --device: skipped: no device runtime (%s)\n", why.c_str());
    return false;
  }
  dev->device = (env.local_rank >= 0 ? env.local_rank : std::max(env.rank, 0)) % ndev;
  braid::device::set_device(dev->device);
  dev->stream = braid::device::create_stream();
  return true;
}

}  // namespace

int main(int argc, char** argv) {
#ifdef BRAID_BENCH_MPI
  const bool mpi = braid::launcher() == "mpirun";
  if (mpi) MPI_Init(&argc, &argv);
#endif
  std::string self = argv[0];
  self = self.substr(self.find_last_of('/') + 1);
  const CollInfo* by_name = find_coll(self);
  CLI::App app{"collective_bench: nccl-tests' sweep for every collective over braid. Run under braidrun, mpirun, "
               "torchrun or srun."};
  SweepArgs args;
  if (by_name) args.coll = by_name->name;
  add_sweep_options(app, args, "float, half, bfloat16, double, int8, uint8, int32, int64, f8e4m3, f8e5m2",
                    "sum, prod, min, max, avg (reducing collectives)", "1: wait for each call before posting the next");
  bool device = false;
  app.add_flag("--device", device,
               "buffers in device memory (device = local rank modulo the device count), one stream per rank; the "
               "time waits for the stream (stream semantics, as nccl-tests); fills and checks copy through the "
               "host. Without a device runtime: says so (skipped) and exits 0");
  int rc = 0;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    rc = app.exit(e);
  }
  SweepOptions o;
  if (rc == 0) {
    const std::string err = resolve(args, "collective_bench", &o);
    if (!err.empty()) {
      std::cerr << "collective_bench: bad arguments: " << err << "\n";
      rc = 2;
    }
  }
  if (rc == 0) {
    try {
      DeviceSide dev;
      if (!device || open_device(&dev)) {
#ifdef BRAID_BENCH_MPI
        braid::Communicator comm = mpi ? braid::from_mpi(MPI_COMM_WORLD) : braid::Communicator::from_env();
#else
        braid::Communicator comm = braid::Communicator::from_env();
#endif
        if (o.coll->rooted && (o.root < 0 || o.root >= comm.size()))
          throw braid::Error(braid::ErrorCode::InvalidUsage,
                             "-r " + std::to_string(o.root) + " is not a rank of " + std::to_string(comm.size()));
        BraidBackend b(comm, device ? &dev : nullptr);
        rc = sweep(b, o);
      }
    } catch (const braid::Error& e) {
      std::cerr << "collective_bench: " << e.what() << "\n";
      rc = e.code() == braid::ErrorCode::InvalidUsage || e.code() == braid::ErrorCode::Unsupported ? 2 : 1;
    }
  }
#ifdef BRAID_BENCH_MPI
  if (mpi && rc == 0) MPI_Finalize();
#endif
  return rc;
}
