// The rotary embedding on a GPU gives the CPU's bits in every floating dtype, forward and backward, with an offset
// and copied columns (skips without a GPU; scripts/gpu-check.sh runs it with MIXTRAIN_REQUIRE_GPU=1).
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "mixtrain/ops/rotary_embedding.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::random_tensor;

TEST(CudaBackend, RotaryEmbeddingGivesTheCpusBits) {
  REQUIRE_CUDA_BACKEND();
  const RotaryOptions o{16, 96, 37, 10000.0};
  for (DType d : kFloatDTypes)
    for (int64_t t : {int64_t{1}, int64_t{31}, int64_t{129}}) {
      const Tensor x = random_tensor({3, t, 100}, 60 + t, d, -4.0f, 4.0f);
      EXPECT_TRUE(bit_equal(rotary_embedding(gpu(x), o), rotary_embedding(x, o))) << dtype_name(d) << " T=" << t;
      EXPECT_TRUE(bit_equal(rotary_embedding_backward(gpu(x), o), rotary_embedding_backward(x, o)))
          << dtype_name(d) << " T=" << t;
    }
}

}  // namespace
}  // namespace mixtrain::ops
