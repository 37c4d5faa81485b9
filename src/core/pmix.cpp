// The PMIx exchange of pmix.hpp: PMIx_Init, rank 0's PMIx_Put, PMIx_Commit, a fence over
// the namespace with data collection, PMIx_Get of rank 0's key, PMIx_Finalize. pmix_info_t
// values are filled by hand (pmix.h's PMIX_INFO_LOAD would link libpmix).
#include "core/pmix.hpp"

#include "base/dynlib.hpp"

#include <braid/config.hpp>
#include <braid/error.hpp>

#if BRAID_HAVE_PMIX
#include <pmix.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace braid::core::pmix {

#if BRAID_HAVE_PMIX
namespace {

struct Api {
  std::string path, file;
  decltype(&::PMIx_Init) init = nullptr;
  decltype(&::PMIx_Finalize) finalize = nullptr;
  decltype(&::PMIx_Put) put = nullptr;
  decltype(&::PMIx_Commit) commit = nullptr;
  decltype(&::PMIx_Fence) fence = nullptr;
  decltype(&::PMIx_Get) get = nullptr;
  decltype(&::PMIx_Error_string) error_string = nullptr;
  decltype(&::PMIx_Value_destruct) value_destruct = nullptr;
  decltype(&::PMIx_Get_version) get_version = nullptr;
};

struct Loaded {
  Api api;
  std::string why;
  bool ok = false;
};

Loaded load_path(const std::string& library) {
  Loaded l;
  Api& a = l.api;
  a.path = library.empty() ? "libpmix.so.2" : library;
  void* h = base::open_library(a.path,
                               "install libpmix2 (Open MPI's packages bring it), or point BRAID_PMIX_LIBRARY at "
                               "libpmix.so.2",
                               &l.why);
  if (h == nullptr) return l;
  std::string missing;
  base::resolve(h, "PMIx_Init", &a.init, &missing);
  base::resolve(h, "PMIx_Finalize", &a.finalize, &missing);
  base::resolve(h, "PMIx_Put", &a.put, &missing);
  base::resolve(h, "PMIx_Commit", &a.commit, &missing);
  base::resolve(h, "PMIx_Fence", &a.fence, &missing);
  base::resolve(h, "PMIx_Get", &a.get, &missing);
  base::resolve(h, "PMIx_Error_string", &a.error_string, &missing);
  base::resolve(h, "PMIx_Value_destruct", &a.value_destruct, &missing);
  base::resolve(h, "PMIx_Get_version", &a.get_version, &missing);
  if (!missing.empty()) {
    l.why = a.path + " has no " + missing + " (not libpmix, or older than PMIx 4)";
    return l;  // the handle stays open (base/dynlib.hpp)
  }
  a.file = base::library_file(h, a.path);
  l.ok = true;
  return l;
}

const Api* load(const std::string& library, std::string* why) {
  static std::mutex mu;
  static auto* loaded = new std::map<std::string, Loaded>();  // never freed: handles stay open
  std::lock_guard<std::mutex> lock(mu);
  auto it = loaded->find(library);
  if (it == loaded->end()) it = loaded->emplace(library, load_path(library)).first;
  if (!it->second.ok) {
    if (why) *why = it->second.why;
    return nullptr;
  }
  return &it->second.api;
}

void set_key(char (&dst)[PMIX_MAX_KEYLEN + 1], const char* key) {
  std::memset(dst, 0, sizeof dst);
  std::strncpy(dst, key, PMIX_MAX_KEYLEN);
}

// PMIx_Init/PMIx_Finalize around one exchange; Finalize also on the error paths, because
// Open MPI's daemons treat a process that initialised PMIx and exits without finalising
// as one that died.
class Session {
 public:
  explicit Session(const Api& a) : a_(a) {
    std::memset(&me_, 0, sizeof me_);
    const pmix_status_t rc = a_.init(&me_, nullptr, 0);
    if (rc != PMIX_SUCCESS)
      throw Error(ErrorCode::InvalidUsage,
                  std::string("PMIx_Init failed: ") + a_.error_string(rc) +
                      " (is this process started by mpirun or srun --mpi=pmix? Otherwise set BRAID_MASTER_ADDR "
                      "and BRAID_MASTER_PORT)");
  }
  ~Session() { a_.finalize(nullptr, 0); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  const pmix_proc_t& me() const { return me_; }

 private:
  const Api& a_;
  pmix_proc_t me_;
};

}  // namespace

std::string describe(const std::string& library) {
  std::string why;
  const Api* a = load(library, &why);
  if (a == nullptr) return "unavailable: " + why;
  return std::string(a->get_version()) + " (" + a->file + ")";
}

std::string share_from_rank0(const std::string& library, const std::string& key, const std::string& value,
                             int rank, std::chrono::milliseconds timeout) {
  std::string why;
  const Api* a = load(library, &why);
  if (a == nullptr)
    throw Error(ErrorCode::InvalidUsage, "no store address and PMIx cannot be used: " + why +
                                             "; set BRAID_MASTER_ADDR and BRAID_MASTER_PORT to the host of rank 0");
  const auto fail = [&](const char* step, pmix_status_t rc) {
    return Error(rc == PMIX_ERR_TIMEOUT ? ErrorCode::Timeout : ErrorCode::Network,
                 std::string("PMIx ") + step + " of the store address (rank " + std::to_string(rank) +
                     ") failed: " + a->error_string(rc) +
                     (rc == PMIX_ERR_TIMEOUT ? " (not every rank of the job created its communicator within the "
                                               "timeout)"
                                             : ""));
  };
  Session session(*a);
  const pmix_proc_t& me = session.me();
  if (static_cast<int>(me.rank) != rank)
    throw Error(ErrorCode::InvalidUsage, "PMIx says this process is rank " + std::to_string(me.rank) +
                                             " of namespace " + me.nspace + " but the launcher's variables say " +
                                             std::to_string(rank) +
                                             "; set BRAID_MASTER_ADDR and BRAID_MASTER_PORT instead");
  pmix_status_t rc;
  if (rank == 0) {
    pmix_value_t v;
    std::memset(&v, 0, sizeof v);
    v.type = PMIX_STRING;
    v.data.string = const_cast<char*>(value.c_str());  // copied by PMIx_Put
    rc = a->put(PMIX_GLOBAL, key.c_str(), &v);
    if (rc != PMIX_SUCCESS) throw fail("put", rc);
  }
  rc = a->commit();
  if (rc != PMIX_SUCCESS) throw fail("commit", rc);

  pmix_proc_t all;
  std::memset(&all, 0, sizeof all);
  std::memcpy(all.nspace, me.nspace, sizeof all.nspace);
  all.rank = PMIX_RANK_WILDCARD;
  pmix_info_t info[2];
  std::memset(info, 0, sizeof info);
  set_key(info[0].key, PMIX_COLLECT_DATA);
  info[0].value.type = PMIX_BOOL;
  info[0].value.data.flag = true;
  set_key(info[1].key, PMIX_TIMEOUT);
  info[1].value.type = PMIX_INT;
  // Whole seconds, at least one (0 would mean no timeout).
  info[1].value.data.integer = static_cast<int>(std::max<long long>(1, (timeout.count() + 999) / 1000));
  rc = a->fence(&all, 1, info, 2);
  if (rc != PMIX_SUCCESS) throw fail("fence", rc);

  pmix_proc_t root = all;
  root.rank = 0;
  pmix_value_t* got = nullptr;
  rc = a->get(&root, key.c_str(), nullptr, 0, &got);
  if (rc != PMIX_SUCCESS || got == nullptr) throw fail("get", rc);
  std::string out;
  const bool is_string = got->type == PMIX_STRING && got->data.string != nullptr;
  if (is_string) out = got->data.string;
  a->value_destruct(got);
  std::free(got);  // PMIX_VALUE_RELEASE: destruct, then free (libpmix allocates with malloc)
  if (!is_string)
    throw Error(ErrorCode::Network, "PMIx get of the store address: rank 0's value under '" + key +
                                        "' is not a string (another program's key?)");
  return out;
}

#else  // !BRAID_HAVE_PMIX

std::string describe(const std::string&) { return "unavailable: not built with PMIx headers (libpmix-dev)"; }

std::string share_from_rank0(const std::string&, const std::string&, const std::string&, int,
                             std::chrono::milliseconds) {
  throw Error(ErrorCode::InvalidUsage,
              "no store address, and this build of braid has no PMIx support (configure with libpmix-dev "
              "installed); set BRAID_MASTER_ADDR and BRAID_MASTER_PORT to the host of rank 0");
}

#endif

}  // namespace braid::core::pmix
