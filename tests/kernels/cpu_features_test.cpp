// cpu_features(): consistency of what cpuid reported, and the GEMM path that follows from it.
#include <gtest/gtest.h>

#include <cstring>

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
  if (f.avx512bw || f.avx512vl || f.avx512dq || f.avx512_bf16 || f.avx512_fp16) EXPECT_TRUE(f.avx512f);
}

TEST(CpuFeatures, GemmPathMatchesFeatures) {
  const CpuFeatures& f = cpu_features();
  const char* isa = gemm_isa();
  const bool known = !std::strcmp(isa, "scalar") || !std::strcmp(isa, "avx2") || !std::strcmp(isa, "avx512");
  EXPECT_TRUE(known) << isa;
  // Never a path above what the CPU has, whatever MIXTRAIN_ISA says.
  if (!std::strcmp(isa, "avx512")) EXPECT_TRUE(f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq);
  if (!std::strcmp(isa, "avx2")) EXPECT_TRUE(f.avx2 && f.fma && f.f16c);
}

}  // namespace
}  // namespace mixtrain::kernels
