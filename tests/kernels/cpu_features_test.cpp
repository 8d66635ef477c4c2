// cpu_features(): consistency of what cpuid reported, and the GEMM path that follows from it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "mixtrain/kernels/cpu_features.h"
#include "mixtrain/kernels/gemm.h"

namespace mixtrain::kernels {
namespace {

TEST(CpuFeatures, IsConsistent) {
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(&f, &cpu_features());  // detected once
  EXPECT_FALSE(f.vendor.empty());
  EXPECT_GE(f.logical_cores, 1);
  // Every AVX-512 CPU also has AVX2, FMA and F16C; subsets need the foundation.
  if (f.avx512f) {
    EXPECT_TRUE(f.avx2);
    EXPECT_TRUE(f.fma);
    EXPECT_TRUE(f.f16c);
  }
  if (f.avx512bw || f.avx512vl || f.avx512dq || f.avx512_bf16 || f.avx512_fp16) {
    EXPECT_TRUE(f.avx512f);
  }
}

TEST(CpuFeatures, GemmPathMatchesFeatures) {
  const CpuFeatures& f = cpu_features();
  const char* isa = gemm_isa();
  const bool known = !std::strcmp(isa, "scalar") || !std::strcmp(isa, "avx2") || !std::strcmp(isa, "avx512");
  EXPECT_TRUE(known) << isa;
  // Never a path above what the CPU has, whatever MIXTRAIN_ISA says.
  if (!std::strcmp(isa, "avx512")) {
    EXPECT_TRUE(f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq);
  }
  if (!std::strcmp(isa, "avx2")) {
    EXPECT_TRUE(f.avx2 && f.fma && f.f16c);
  }
}

int path_rank(const char* isa) {
  if (!std::strcmp(isa, "avx512")) return 2;
  if (!std::strcmp(isa, "avx2")) return 1;
  return 0;
}

// MIXTRAIN_ISA is read once, at the first GEMM, so this test re-runs its own binary with the variable set;
// in that child it checks the path is the one asked for, or a lower one when the CPU lacks it.
TEST(GemmIsa, EnvironmentForcesALowerPath) {
  if (const char* wanted = std::getenv("MIXTRAIN_ISA")) {
    const CpuFeatures& f = cpu_features();
    const int best = (f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.fma && f.f16c) ? 2
                     : (f.avx2 && f.fma && f.f16c)                                              ? 1
                                                                                                : 0;
    EXPECT_EQ(path_rank(gemm_isa()), std::min(path_rank(wanted), best)) << wanted << " gave " << gemm_isa();
    return;
  }
  char self[4096] = {};
  ASSERT_GT(readlink("/proc/self/exe", self, sizeof(self) - 1), 0);
  for (const char* isa : {"scalar", "avx2", "avx512"}) {
    const std::string command = std::string("MIXTRAIN_ISA=") + isa + " '" + self +
                                "' --gtest_filter=GemmIsa.EnvironmentForcesALowerPath > /dev/null 2>&1";
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
  }
}

}  // namespace
}  // namespace mixtrain::kernels
