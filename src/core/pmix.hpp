// PMIx at launch: how a program started by mpirun (Open MPI's ORTE/PRRTE) or by
// `srun --mpi=pmix` finds rank 0's store without BRAID_MASTER_ADDR/PORT. The launcher's
// daemons run a PMIx server that every launched process can reach (PMIX_NAMESPACE,
// PMIX_SERVER_URI* in its environment); rank 0 puts its UniqueId there, every rank joins a
// fence, and the others read it back. That is the key-value exchange MPI itself uses at
// MPI_Init, so it works across hosts wherever the launcher does, with no guessed port.
//
// libpmix.so.2 is loaded at run time (base/dynlib; BRAID_PMIX_LIBRARY points elsewhere);
// only this module's .cpp includes pmix.h, from libpmix-dev at build time.
#pragma once

#include <chrono>
#include <string>

namespace braid::core::pmix {

/// What the loaded libpmix says about itself ("4.2.2 (/usr/lib/.../libpmix.so.2)"), or why
/// it cannot be used (not built with PMIx headers, library absent, a missing entry point).
std::string describe(const std::string& library);

/// Shares `value` from rank 0 of this process's PMIx namespace with every rank of it:
/// rank 0 puts it under `key`, every rank commits and joins a fence (collective over the
/// whole namespace, bounded by `timeout`), and each rank returns rank 0's value. `rank` is
/// the launcher's rank as braid read it; PMIx's own must agree. PMIx is initialised and
/// finalised around the exchange (reference counted, so an MPI program's PMIx is left as it
/// was). Throws braid::Error naming the step that failed and what to do: InvalidUsage when
/// PMIx is unavailable or the ranks disagree, Timeout when the fence does not complete,
/// Network for other PMIx errors.
std::string share_from_rank0(const std::string& library, const std::string& key, const std::string& value,
                             int rank, std::chrono::milliseconds timeout);

}  // namespace braid::core::pmix
