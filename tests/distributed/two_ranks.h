// Helpers of the data-parallel tests. ctest runs them under `mpirun -np 2` with one thread per rank; built
// without MPI, the two-rank tests skip (and only then).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "mixtrain/autograd/var.h"
#include "mixtrain/distributed/communicator.h"

namespace mixtrain::distributed_test {

// Skips when the build has no MPI (a failure instead under MIXTRAIN_REQUIRE_MPI=1, which .ci/run sets: CI installs
// MPI, so a skip there means the build lost it); fails unless this is one of exactly two ranks.
#define MIXTRAIN_REQUIRE_TWO_RANKS()                                                                     \
  do {                                                                                                   \
    if (!::mixtrain::mpi_compiled()) {                                                                   \
      const char* required = std::getenv("MIXTRAIN_REQUIRE_MPI");                                       \
      if (required != nullptr && std::strcmp(required, "1") == 0)                                        \
        FAIL() << "MIXTRAIN_REQUIRE_MPI=1 but this build has no MPI";                                    \
      GTEST_SKIP() << "built without MPI (MIXTRAIN_MPI=OFF or not found)";                              \
    }                                                                                                    \
    ASSERT_EQ(::mixtrain::world_communicator().size(), 2)                                               \
        << "run this test under `mpirun -np 2` (its ctest entry does)";                                 \
  } while (0)

// Every variable's float32 values, concatenated in order.
inline std::vector<float> flat_values(const std::vector<Var>& vars) {
  std::vector<float> all;
  for (const Var& v : vars) {
    const std::vector<float> f = v.value().to_floats();
    all.insert(all.end(), f.begin(), f.end());
  }
  return all;
}

// Whether `values` has the same bits on every rank (rank 0's copy is broadcast and compared bytewise).
inline bool same_bits_on_all_ranks(const std::vector<float>& values, Communicator& comm) {
  std::vector<float> root = values;
  comm.broadcast(root.data(), static_cast<int64_t>(root.size() * sizeof(float)), 0);
  double differs = std::memcmp(root.data(), values.data(), values.size() * sizeof(float)) != 0 ? 1 : 0;
  comm.all_reduce(&differs, 1, ReduceOp::kSum);
  return differs == 0;
}

// Largest |a - b| / (1 + |b|) over the elements.
inline double max_relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]) / (1.0 + std::abs(static_cast<double>(b[i])));
    worst = std::max(worst, d);
  }
  return a.size() == b.size() ? worst : 1e30;
}

}  // namespace mixtrain::distributed_test
