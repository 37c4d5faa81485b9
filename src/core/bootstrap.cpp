// Creating communicators from the environment (braidrun, torchrun, mpirun, srun)
// and from NCCL-style unique ids.
#include "base/auth.hpp"
#include "base/check.hpp"
#include "base/logging.hpp"
#include "base/text.hpp"
#include "core/communicator_impl.hpp"
#include "core/pmix.hpp"
#include "core/unique_id.hpp"
#include "transport/interfaces.hpp"

#include <braid/error.hpp>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

namespace braid {

namespace {

constexpr const char* kUidMagic = "braid-uid-1";

// Store servers started by create_unique_id(): waiting for this process's first
// communicator of the id to adopt them, then shared by every communicator of the id made in
// this process (ranks that are threads, ncclCommInitAll), so that it lives until the last.
struct UidServer {
  std::unique_ptr<TcpStoreServer> waiting;
  std::weak_ptr<TcpStoreServer> adopted;
};
std::mutex g_uid_mu;
std::map<std::string, UidServer>& uid_servers() {
  static std::map<std::string, UidServer> servers;
  return servers;
}

}  // namespace

namespace core {

std::optional<UniqueIdFields> parse_unique_id(const UniqueId& id) {
  const std::string text(id.bytes.data(), strnlen(id.bytes.data(), id.bytes.size()));
  std::istringstream in(text);
  std::string magic;
  UniqueIdFields f;
  in >> magic >> f.addr >> f.port >> f.nonce;
  if (magic != kUidMagic || f.port <= 0 || f.port >= 65536 || f.nonce.empty()) return std::nullopt;
  return f;
}

}  // namespace core

UniqueId Communicator::create_unique_id() {
  const auto& cfg = core::Config::global();
  // No master address under mpirun (the id replaces it): advertise an address other
  // hosts can reach, as the header promises, not 127.0.0.1.
  const std::string addr = transport::select_address(cfg.settings.text("BRAID_SOCKET_IFNAME"), cfg.master_addr, true);
  // The nonce is the id's secret: the store serves only clients that present it (the
  // ranks, who read it from the id), and every key lives under it.
  // 128 bits from the system's cryptographic source (it is the job's token too).
  const std::string nonce_bytes = base::auth::random_bytes(16);
  std::ostringstream nonce;
  nonce << base::hex_bytes(nonce_bytes.data(), nonce_bytes.size());
  // It listens where it is advertised, nowhere else (BRAID_STORE_BIND overrides).
  const std::string& bind = cfg.settings.text("BRAID_STORE_BIND");
  auto server = std::make_unique<TcpStoreServer>(bind.empty() ? addr : bind, 0, nonce.str());
  std::ostringstream text;
  text << kUidMagic << ' ' << addr << ' ' << server->port() << ' ' << nonce.str();
  const std::string s = text.str();
  UniqueId id;
  BRAID_CHECK(s.size() < id.bytes.size(), Internal, "unique id text too long");
  std::memcpy(id.bytes.data(), s.data(), s.size());
  std::lock_guard<std::mutex> lock(g_uid_mu);
  uid_servers()[nonce.str()].waiting = std::move(server);
  return id;
}

Communicator Communicator::from_unique_id(const UniqueId& id, int rank, int size, const CommOptions& options) {
  const std::optional<core::UniqueIdFields> fields = core::parse_unique_id(id);
  BRAID_CHECK(fields.has_value(), InvalidUsage,
              "from_unique_id: the id is not a braid UniqueId (was it copied completely, all 128 bytes?)");
  const std::string& addr = fields->addr;
  const int port = fields->port;
  const std::string& nonce = fields->nonce;
  const auto& cfg = core::Config::global();
  const auto timeout = options.timeout.count() > 0 ? options.timeout : cfg.timeout;
  auto base = std::make_shared<TcpStore>(addr, static_cast<std::uint16_t>(port), false, timeout, nonce);
  // The store's address tells every rank which of its interfaces reaches the others. The
  // nonce reached every rank privately (MPI_Bcast, PMIx, the caller's channel): it is the
  // job's token too, so no token rests in the store (BRAID_AUTH_TOKEN still wins).
  auto impl =
      std::make_unique<Impl>(std::make_shared<PrefixStore>("uid-" + nonce, base), rank, size, options, addr, nonce);
  std::lock_guard<std::mutex> lock(g_uid_mu);
  if (auto it = uid_servers().find(nonce); it != uid_servers().end()) {
    std::shared_ptr<TcpStoreServer> server;
    if (it->second.waiting) {
      server = std::shared_ptr<TcpStoreServer>(std::move(it->second.waiting));
      it->second.adopted = server;
    } else {
      server = it->second.adopted.lock();
    }
    if (server) {
      impl->hosted_server = std::move(server);
      impl->hosts_store = true;
    } else {
      uid_servers().erase(it);  // its communicators are gone, and with them the store
    }
  }
  return Communicator(std::move(impl));
}

// Under mpirun (or srun --mpi=pmix) with no store address: rank 0's UniqueId reaches every
// rank through the launcher's PMIx server (core/pmix.hpp), as braid::from_mpi does with
// MPI_Bcast. Every rank of the job must call from_env, the same number of times: the
// n-th call of each process uses the key braid.uid.<n>.
namespace {
Communicator from_pmix(int rank, int size, const CommOptions& options, std::chrono::milliseconds timeout) {
  static std::atomic<unsigned> calls{0};
  const std::string key = "braid.uid." + std::to_string(calls.fetch_add(1));
  const auto& cfg = core::Config::global();
  UniqueId id;
  std::string text;
  if (rank == 0) {
    id = Communicator::create_unique_id();
    text.assign(id.bytes.data(), strnlen(id.bytes.data(), id.bytes.size()));
  }
  try {
    text = core::pmix::share_from_rank0(cfg.pmix_library, key, text, rank, timeout);
  } catch (...) {
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(g_uid_mu);  // the store server no rank will use
      if (auto f = core::parse_unique_id(id)) uid_servers().erase(f->nonce);
    }
    throw;
  }
  BRAID_CHECK(text.size() < id.bytes.size(), Network,
              "from_env: rank 0's UniqueId read through PMIx is " << text.size() << " bytes, more than a UniqueId holds");
  id.bytes.fill('\0');
  std::memcpy(id.bytes.data(), text.data(), text.size());
  BRAID_LOG(info, "from_env: rank " << rank << " of " << size << " (" << cfg.launcher
                                    << ") found rank 0's store through PMIx (namespace " << cfg.pmix_namespace << ")");
  return Communicator::from_unique_id(id, rank, size, options);
}
}  // namespace

Communicator Communicator::from_env(const CommOptions& options) {
  const auto& cfg = core::Config::global();
  BRAID_CHECK(cfg.rank && cfg.world_size, InvalidUsage,
              "from_env: no rank/world size in the environment; set BRAID_RANK and BRAID_WORLD_SIZE (or run "
              "under braidrun, torchrun, mpirun or srun)");
  const int rank = *cfg.rank, size = *cfg.world_size;
  BRAID_CHECK(rank < size, InvalidUsage,
              "from_env: rank " << rank << " is not below world size " << size << " (from " << cfg.launcher
                                << " variables)");
  const auto timeout = options.timeout.count() > 0 ? options.timeout : cfg.timeout;
  if (size > 1 && cfg.master_addr.empty() && !cfg.master_port && !cfg.pmix_namespace.empty())
    return from_pmix(rank, size, options, timeout);
  std::shared_ptr<Store> store;
  bool hosts = false;
  if (size == 1 && (cfg.master_addr.empty() || !cfg.master_port)) {
    // A job of one needs no rendezvous: serve a private store on loopback.
    store = std::make_shared<TcpStore>("127.0.0.1", 0, true, timeout);
    hosts = true;
  } else {
    BRAID_CHECK(!cfg.master_addr.empty(), InvalidUsage,
                "from_env: rank " << rank << " of " << size << " (" << cfg.launcher
                                  << ") has no store address; set BRAID_MASTER_ADDR (or MASTER_ADDR) to the "
                                     "host of rank 0");
    BRAID_CHECK(cfg.master_port.has_value(), InvalidUsage,
                "from_env: no store port; set BRAID_MASTER_PORT (or MASTER_PORT) to a free TCP port on "
                    << cfg.master_addr);
    hosts = rank == 0 && !cfg.store_external;
    if (rank == 0 && cfg.auth_token.empty()) {
      static std::once_flag said;
      std::call_once(said, [&] {
        BRAID_LOG(info, "from_env: this job is unauthenticated: no BRAID_AUTH_TOKEN and no private channel to share "
                        "one (a bare master address " << cfg.master_addr << ", as under torchrun), so its store "
                        "serves anyone who can reach it and the token rank 0 makes travels through it; set "
                        "BRAID_AUTH_TOKEN on every rank, or launch with braidrun, mpirun or srun "
                        "(docs/reliability.md, \"Threat model\")");
      });
    }
    // With BRAID_AUTH_TOKEN, the store serves only clients that present it (braidrun's too).
    store = std::make_shared<TcpStore>(cfg.master_addr, static_cast<std::uint16_t>(*cfg.master_port), hosts,
                                       timeout, cfg.auth_token);
  }
  auto impl = std::make_unique<Impl>(store, rank, size, options);
  impl->hosts_store = hosts;
  return Communicator(std::move(impl));
}

}  // namespace braid
