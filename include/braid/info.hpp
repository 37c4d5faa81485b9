// braid — version, build features and configuration report.
#pragma once

#include <braid/export.hpp>

#include <string>

namespace braid {

/// The library version, "MAJOR.MINOR.PATCH".
BRAID_API std::string version();

/// One line per optional feature with "yes"/"no" (cuda, ucx, ibverbs, mpi, shm...).
BRAID_API std::string build_features();

/// Every BRAID_* configuration variable as a table: name, type, default, current
/// value (from this process's environment) and help.
BRAID_API std::string config_report();

/// docs/configuration.md as generated from the configuration table.
BRAID_API std::string config_markdown();

}  // namespace braid
