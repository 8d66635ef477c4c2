// ops::global_norm against a float64 reference in every dtype, and the clipping rule it feeds
// (ops/shared/clip_factor.h) at its edges: the rule the CPU optimizer and every fused device update share.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "mixtrain/ops/global_norm.h"
#include "op_test_util.h"
#include "ops/shared/clip_factor.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::random_tensor;
using testing::to_doubles;

TEST(GlobalNorm, MatchesFloat64OverTensorsOfEveryDType) {
  // Several tensors, one past a CPU chunk (65536) so that the chunked sum is exercised, magnitudes far apart.
  std::vector<Tensor> xs;
  double squares = 0;
  int i = 0;
  for (DType d : kFloatDTypes)
    for (int64_t n : {int64_t{1}, int64_t{129}, int64_t{70001}}) {
      xs.push_back(random_tensor({n}, 40 + static_cast<uint64_t>(i), d, -4.0f, 4.0f));
      for (double v : to_doubles(xs.back())) squares += v * v;
      ++i;
    }
  xs.insert(xs.begin() + 2, Tensor());  // undefined tensors are skipped
  const Tensor norm = global_norm(xs);
  EXPECT_EQ(norm.dtype(), DType::kFloat32);
  EXPECT_EQ(norm.numel(), 1);
  const double want = std::sqrt(squares);
  // Double sum of exact squares of float32 values, one rounding of the root into float32.
  EXPECT_NEAR(norm.item(), want, 0x1p-24 * want * 1.01);
  EXPECT_EQ(global_norm({}).item(), 0.0f);
  EXPECT_EQ(global_norm({Tensor::empty({0}, DType::kFloat16)}).item(), 0.0f);
}

TEST(GlobalNorm, ANonFiniteElementMakesItNonFinite) {
  EXPECT_TRUE(std::isinf(global_norm({Tensor::from_floats({3}, {1.0f, INFINITY, 2.0f})}).item()));
  EXPECT_TRUE(std::isnan(global_norm({Tensor::from_floats({2}, {1.0f, NAN}), Tensor::from_floats({1}, {INFINITY})})
                             .item()));
  // float16's largest value squared overflows float32 but not the double sum.
  EXPECT_EQ(global_norm({Tensor::from_floats({1}, {65504.0f}, DType::kFloat16)}).item(), 65504.0f);
}

TEST(GlobalNorm, RefusesIntegerTensors) {
  EXPECT_THROW(global_norm({Tensor::from_ints({2}, {1, 2})}), Error);
}

TEST(ClipFactor, ScalesOnlyAboveTheClipNormAndPoisonsANonFiniteNorm) {
  float f = 7.0f;
  EXPECT_FALSE(shared::clip_factor(0.0f, 1.0f, &f));
  EXPECT_FALSE(shared::clip_factor(1.0f, 1.0f, &f));  // at the clip norm: unchanged
  EXPECT_EQ(f, 7.0f);
  ASSERT_TRUE(shared::clip_factor(3.0f, 1.0f, &f));
  EXPECT_EQ(f, static_cast<float>(1.0 / 3.0));  // the quotient in double, rounded once
  ASSERT_TRUE(shared::clip_factor(std::nextafter(0.5f, 1.0f), 0.5f, &f));
  EXPECT_LT(f, 1.0f);
  ASSERT_TRUE(shared::clip_factor(INFINITY, 1.0f, &f));
  EXPECT_TRUE(std::isnan(f));
  f = 0.0f;
  ASSERT_TRUE(shared::clip_factor(NAN, 1.0f, &f));
  EXPECT_TRUE(std::isnan(f));
  ASSERT_TRUE(shared::clip_factor(std::numeric_limits<float>::max(), 1.0f, &f));
  EXPECT_GT(f, 0.0f);
}

}  // namespace
}  // namespace mixtrain::ops
