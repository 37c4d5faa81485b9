// UCX loaded at run time. libucp (and libucs, which it needs) is opened with dlopen and its
// entry points are kept in one table, so that libbraid.so has no NEEDED entry on UCX, loads
// where UCX is absent, and can use another copy of UCX than the one it was built against
// (BRAID_UCX_LIBRARY; HPC-X, MOFED or the PyPI wheel). NCCL loads libibverbs the same way.
//
// The headers are Debian's libucx-dev (1.13, UCP API 1.13); any later libucp accepts them
// (ucp_init_version checks the API version it is given).
#pragma once

#include "transport/ucx/ucx_probe.hpp"

#include <ucp/api/ucp.h>

#include <string>

namespace braid::transport::ucx {

/// The UCP entry points braid calls, resolved from the loaded library.
struct Api {
  std::string path;  ///< what dlopen was given ("libucp.so.0" or BRAID_UCX_LIBRARY)
  unsigned major = 0, minor = 0, release = 0;

  decltype(&::ucp_get_version) get_version = nullptr;
  decltype(&::ucp_config_read) config_read = nullptr;
  decltype(&::ucp_config_release) config_release = nullptr;
  decltype(&::ucp_config_modify) config_modify = nullptr;
  decltype(&::ucp_init_version) init_version = nullptr;
  decltype(&::ucp_cleanup) cleanup = nullptr;
  decltype(&::ucp_context_query) context_query = nullptr;
  decltype(&::ucp_context_print_info) context_print_info = nullptr;
  decltype(&::ucp_worker_create) worker_create = nullptr;
  decltype(&::ucp_worker_destroy) worker_destroy = nullptr;
  decltype(&::ucp_worker_get_address) worker_get_address = nullptr;
  decltype(&::ucp_worker_release_address) worker_release_address = nullptr;
  decltype(&::ucp_worker_get_efd) worker_get_efd = nullptr;
  decltype(&::ucp_worker_arm) worker_arm = nullptr;
  decltype(&::ucp_worker_progress) worker_progress = nullptr;
  decltype(&::ucp_ep_create) ep_create = nullptr;
  decltype(&::ucp_ep_close_nbx) ep_close_nbx = nullptr;
  decltype(&::ucp_tag_send_nbx) tag_send_nbx = nullptr;
  decltype(&::ucp_tag_recv_nbx) tag_recv_nbx = nullptr;
  decltype(&::ucp_request_check_status) request_check_status = nullptr;
  decltype(&::ucp_request_cancel) request_cancel = nullptr;
  decltype(&::ucp_request_free) request_free = nullptr;
  decltype(&::ucs_status_string) status_string = nullptr;

  /// ucp_init with the API version of the headers braid was built with.
  ucs_status_t init(const ucp_params_t* params, const ucp_config_t* config, ucp_context_h* context) const {
    return init_version(UCP_API_MAJOR, UCP_API_MINOR, params, config, context);
  }
};

/// Loads UCX once per process (thread-safe) from `library` ("" = "libucp.so.0"); later calls
/// return the same table whatever they pass. Null when UCX cannot be used, with the reason
/// in *why (the dlopen error, a missing entry point, or a version older than 1.10).
const Api* load(const std::string& library, std::string* why);

/// The transport resources of an open context as UCX names them ("tcp/eth0",
/// "rc_mlx5/mlx5_0:1"), read from ucp_context_print_info.
std::vector<std::string> context_resources(const Api& api, ucp_context_h context);

}  // namespace braid::transport::ucx
