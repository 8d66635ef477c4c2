// ops::time_matmul on a GPU (the timed GEMM of `mixtrain bench gemm --device cuda` and doctor's GPU lines): its
// product is the CPU GEMM's within the GEMM's error bound, and its time covers the GPU's work, not only the
// launches. Skips without a GPU; MIXTRAIN_REQUIRE_GPU=1 (scripts/gpu-check.sh) makes the skip a failure.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "mixtrain/ops/gemm_timing.h"
#include "mixtrain/ops/matmul.h"
#include "mixtrain/ops/transfer.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

#define REQUIRE_GPU_GEMM()                                                                       \
  do {                                                                                           \
    REQUIRE_CUDA_BACKEND();                                                                      \
    const std::string problem_ = gemm_device_problem(Device::cuda(0));                           \
    if (!problem_.empty()) {                                                                     \
      if (gpu_required()) FAIL() << "MIXTRAIN_REQUIRE_GPU=1 but: " << problem_;                  \
      GTEST_SKIP() << problem_;                                                                  \
    }                                                                                            \
  } while (0)

TEST(CudaBackend, TimedGemmMatchesTheCpuGemm) {
  REQUIRE_GPU_GEMM();
  const Device gpu = Device::cuda(0);
  constexpr int64_t n = 129;
  for (DType dt : testing::kFloatDTypes) {
    const GemmTiming t = time_matmul(gpu, dt, n, 0.05, 11);
    EXPECT_EQ(t.device, gpu);
    EXPECT_GE(t.batches, 2);
    EXPECT_GE(t.per_batch, 1);
    EXPECT_TRUE(std::isfinite(t.gflops) && t.gflops > 0) << t.gflops;
    EXPECT_EQ(t.method.rfind("cublaslt", 0), 0u) << t.method;
    ASSERT_EQ(t.c.device(), gpu);
    ASSERT_EQ(t.c.dtype(), dt);
    // The same operands on the CPU, through the CPU's GEMM.
    const Tensor a = to_device(t.a, Device::cpu()), b = to_device(t.b, Device::cpu());
    const Tensor want = matmul(a, b);
    const Tensor got = to_device(t.c, Device::cpu());
    const std::vector<float> av = a.to_floats(), bv = b.to_floats(), wv = want.to_floats(), gv = got.to_floats();
    int reported = 0;
    for (int64_t i = 0; i < n && reported < 5; ++i) {
      for (int64_t j = 0; j < n && reported < 5; ++j) {
        double magnitude = 0;  // sum |a||b| of this element
        for (int64_t p = 0; p < n; ++p)
          magnitude += std::fabs(static_cast<double>(av[static_cast<size_t>(i * n + p)])) *
                       std::fabs(static_cast<double>(bv[static_cast<size_t>(p * n + j)]));
        // Both sides sum n float32 products in their own order (each within n units of float32 of the
        // magnitude; TF32 is off unless MIXTRAIN_CUDA_TF32=1), then round once into dt.
        const size_t k = static_cast<size_t>(i * n + j);
        const double tol = 2 * testing::unit(dt) * std::fabs(wv[k]) + 2.0 * n * 0x1p-24 * magnitude +
                           2 * testing::subnormal_step(dt);
        if (std::fabs(static_cast<double>(gv[k]) - wv[k]) <= tol) continue;
        ADD_FAILURE() << dtype_name(dt) << " C[" << i << ", " << j << "]: gpu " << gv[k] << " cpu " << wv[k]
                      << " tolerance " << tol;
        ++reported;
      }
    }
  }
}

TEST(CudaBackend, TimedGemmWaitsForTheGpu) {
  REQUIRE_GPU_GEMM();
  // 2 * 4096^3 flops in float32 without TF32: milliseconds on any GPU (about 2 ms at the H200's 67 TFLOP/s).
  // Timed without waiting for the device, a product would cost only its launch, tens of microseconds of host
  // time, and "run" at several PFLOP/s; no GPU reaches 200 TFLOP/s in plain float32.
  const GemmTiming t = time_matmul(Device::cuda(0), DType::kFloat32, 4096, 0.05);
  if (t.method == "cublaslt") {
    EXPECT_LT(t.gflops, 2e5) << "a float32 GEMM timed at " << t.gflops << " GFLOP/s: the timing missed the GPU's work";
  }
  EXPECT_GT(t.gflops, 1.0);
}

}  // namespace
}  // namespace mixtrain::ops
