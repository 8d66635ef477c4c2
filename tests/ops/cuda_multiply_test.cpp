// The element-wise product on a GPU gives the CPU's bits in every floating dtype, forward and backward (skips
// without a GPU; scripts/gpu-check.sh runs it with MIXTRAIN_REQUIRE_GPU=1).
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "mixtrain/ops/multiply.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::random_tensor;

TEST(CudaBackend, MultiplyGivesTheCpusBits) {
  REQUIRE_CUDA_BACKEND();
  for (DType d : kFloatDTypes)
    for (int64_t n : {int64_t{1}, int64_t{129}, int64_t{100003}}) {
      const Tensor a = random_tensor({n}, 40 + n, d, -300.0f, 300.0f);  // float16 overflows past 65504
      const Tensor b = random_tensor({n}, 80 + n, d, -300.0f, 300.0f);
      const Tensor dy = random_tensor({n}, 50 + n, DType::kFloat32);
      EXPECT_TRUE(bit_equal(multiply(gpu(a), gpu(b)), multiply(a, b))) << dtype_name(d) << " n=" << n;
      EXPECT_TRUE(bit_equal(multiply_backward(gpu(dy), gpu(b)), multiply_backward(dy, b))) << dtype_name(d) << " n=" << n;
    }
}

}  // namespace
}  // namespace mixtrain::ops
