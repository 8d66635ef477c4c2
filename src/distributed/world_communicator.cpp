// Which communicator this process's job has: MPI's world when an MPI launcher started it and the build has MPI,
// the single process otherwise. Apart from the communicators themselves, which know nothing of launchers.
#include <cstdlib>

#include "mixtrain/core/environment.h"
#include "mixtrain/core/error.h"
#include "mixtrain/distributed/communicator.h"
#include "mpi_world.h"

namespace mixtrain {

namespace {
int64_t launcher_size() {
  for (const auto& v : {env::ompi_comm_world_size(), env::pmi_size()})
    if (v) return std::atoll(v->c_str());
  return env::pmix_rank() ? -1 : 0;  // -1: launched, size unknown
}
}  // namespace

bool mpi_compiled() {
#ifdef MIXTRAIN_HAVE_MPI
  return true;
#else
  return false;
#endif
}

bool launched_by_mpi() { return launcher_size() != 0; }

Communicator& world_communicator() {
#ifdef MIXTRAIN_HAVE_MPI
  if (launched_by_mpi()) return detail::mpi_world();
#else
  const int64_t n = launcher_size();
  if (n > 1)
    MIXTRAIN_FAIL(kInvalidInput,
                  "started by an MPI launcher as one of " << n << " processes, but this build has no MPI",
                  "rebuild with Open MPI installed (libopenmpi-dev; cmake -DMIXTRAIN_MPI=ON), or run one process");
#endif
  static SingleProcessCommunicator single;
  return single;
}

}  // namespace mixtrain
