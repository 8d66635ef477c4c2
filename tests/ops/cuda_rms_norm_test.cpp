// RMS normalization on a GPU gives the CPU's bits in every floating dtype, forward and backward (skips without a
// GPU; scripts/gpu-check.sh runs it with MIXTRAIN_REQUIRE_GPU=1). Every sum runs in the CPU's order
// (ops/shared/rms_norm_row.h), so they agree bit for bit; NaN-free inputs, so no payload question arises.
#include <gtest/gtest.h>

#include <cmath>

#include "cuda_test_util.h"
#include "mixtrain/ops/rms_norm.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::random_tensor;

TEST(CudaBackend, RmsNormAndItsGradientGiveTheCpuBits) {
  REQUIRE_CUDA_BACKEND();
  constexpr float kEps = 1e-6f;
  for (DType dt : kFloatDTypes)
    for (const Shape& shape : {Shape({1, 1}), Shape({3, 7}), Shape({5, 17}), Shape({2, 3, 129}), Shape({130, 31}),
                               Shape({4, 1000}), Shape({300, 64}), Shape({0, 5})}) {
      const int64_t d = shape[-1];
      // Terms of mixed magnitudes, so that another summation order shows in the bits.
      std::vector<float> xv =
          random_tensor(shape, 231 + static_cast<uint64_t>(shape.numel()), DType::kFloat32).to_floats();
      for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::ldexp(xv[i], static_cast<int>(i * 7 % 23) - 11) + 3.0f;
      const Tensor x = Tensor::from_floats(shape, xv, dt), scale = random_tensor({d}, 237, DType::kFloat32, 0.5f, 1.5f);
      const RmsNormOutput want = rms_norm(x, scale, kEps);
      const RmsNormOutput got = rms_norm(gpu(x), gpu(scale), kEps);
      const std::string what = std::string(dtype_name(dt)) + " " + shape.to_string();
      EXPECT_TRUE(bit_equal(got.y, want.y)) << "rms_norm " << what;
      EXPECT_TRUE(bit_equal(got.rstd, want.rstd)) << "rms_norm rstd " << what;
      for (DType dy_dt : {dt, DType::kFloat32})
        for (bool need_x : {true, false}) {
          const std::string which = what + " dy " + dtype_name(dy_dt) + (need_x ? "" : " without dx");
          const Tensor dy = random_tensor(shape, 249, dy_dt);
          // Both backwards read the CPU's statistic, so they see the same inputs.
          const RmsNormGrads g = rms_norm_backward(dy, x, want.rstd, scale, need_x);
          const RmsNormGrads g_gpu = rms_norm_backward(gpu(dy), gpu(x), gpu(want.rstd), gpu(scale), need_x);
          EXPECT_EQ(g_gpu.dx.defined(), need_x) << which;
          if (need_x) {
            EXPECT_TRUE(bit_equal(g_gpu.dx, g.dx)) << "rms_norm_backward dx " << which;
          }
          EXPECT_TRUE(bit_equal(g_gpu.dscale, g.dscale)) << "rms_norm_backward dscale " << which;
        }
    }
}

}  // namespace
}  // namespace mixtrain::ops
