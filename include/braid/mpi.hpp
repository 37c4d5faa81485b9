// braid — communicators from MPI, for programs that already use MPI (header-only).
//
//   #include <braid/mpi.hpp>
//   MPI_Init(&argc, &argv);
//   braid::Communicator comm = braid::from_mpi(MPI_COMM_WORLD);
//
// Under mpirun no BRAID_MASTER_ADDR/PORT is needed: rank 0 of the MPI communicator
// creates a UniqueId (a store server in its process), MPI_Bcast gives it to the others,
// and every rank joins with its MPI rank, as nccl-tests does with ncclGetUniqueId. This
// header is the only braid header that includes <mpi.h>; libbraid does not link MPI, so
// the program links it (find_package(MPI), MPI::MPI_CXX).
#pragma once

#include <braid/communicator.hpp>
#include <braid/error.hpp>

#include <mpi.h>

#include <array>
#include <cstring>
#include <exception>
#include <string>

namespace braid {

/// Creates a braid Communicator over the ranks of `comm` (same rank numbers and size).
/// Collective over `comm`: every rank must call it. If rank 0 cannot create the id, every
/// rank throws braid::Error(System) with rank 0's reason (none is left waiting in
/// MPI_Bcast); an MPI failure throws braid::Error(System) naming the MPI call.
inline Communicator from_mpi(MPI_Comm comm, const CommOptions& options = {}) {
  int rank = 0, size = 0;
  if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS || MPI_Comm_size(comm, &size) != MPI_SUCCESS)
    throw Error(ErrorCode::System, "braid::from_mpi: MPI_Comm_rank/MPI_Comm_size failed (is MPI initialized?)");
  // One broadcast: a status byte, then rank 0's UniqueId or its error message.
  std::array<char, 1 + sizeof(UniqueId::bytes) + 256> msg{};
  if (rank == 0) {
    try {
      const UniqueId id = Communicator::create_unique_id();
      msg[0] = 1;
      std::memcpy(msg.data() + 1, id.bytes.data(), id.bytes.size());
    } catch (const std::exception& e) {
      msg[0] = 0;
      std::strncpy(msg.data() + 1, e.what(), msg.size() - 2);
    }
  }
  if (MPI_Bcast(msg.data(), static_cast<int>(msg.size()), MPI_BYTE, 0, comm) != MPI_SUCCESS)
    throw Error(ErrorCode::System, "braid::from_mpi: MPI_Bcast of the UniqueId failed");
  if (msg[0] != 1)
    throw Error(ErrorCode::System,
                "braid::from_mpi: rank 0 could not create the communicator's id: " + std::string(msg.data() + 1));
  UniqueId id;
  std::memcpy(id.bytes.data(), msg.data() + 1, id.bytes.size());
  return Communicator::from_unique_id(id, rank, size, options);
}

}  // namespace braid
