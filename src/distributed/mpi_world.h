// The MPI world communicator (src/distributed/mpi_communicator.cpp, compiled only when the build found MPI).
#pragma once

#include "mixtrain/distributed/communicator.h"

namespace mixtrain::detail {
#ifdef MIXTRAIN_HAVE_MPI
// Initialises MPI on the first call (MPI_THREAD_FUNNELED: OpenMP threads compute, only the calling thread talks)
// and finalises it when the process exits.
Communicator& mpi_world();
#endif
}  // namespace mixtrain::detail
