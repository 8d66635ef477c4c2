// The square against float64 in every floating dtype on odd shapes, its backward against the float64 finite
// difference, views, mixed gradient dtypes and refused inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "mixtrain/ops/square.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::kOddSizes;
using testing::random_tensor;
using testing::subnormal_step;
using testing::to_doubles;
using testing::unit;

TEST(Square, MatchesFloat64InEveryDType) {
  for (DType d : kFloatDTypes)
    for (int64_t n : kOddSizes) {
      Tensor x = random_tensor({3, n}, 10 + n, d, -4.0f, 4.0f);
      Tensor y = square(x);
      ASSERT_EQ(y.shape(), x.shape());
      ASSERT_EQ(y.dtype(), d);
      const std::vector<double> xv = to_doubles(x), yv = to_doubles(y);
      for (size_t i = 0; i < xv.size(); ++i) {
        const double want = xv[i] * xv[i];
        // One float32 product (exact for 16-bit inputs, half a float32 unit otherwise), then one rounding into d
        // (half a subnormal step where the square falls below d's normal range).
        EXPECT_NEAR(yv[i], want, (unit(d) + 0x1p-24) * want + subnormal_step(d) / 2) << dtype_name(d) << " x=" << xv[i];
      }
    }
}

TEST(Square, BackwardMatchesTheFiniteDifference) {
  for (DType d : kFloatDTypes)
    for (int64_t n : kOddSizes) {
      Tensor x = random_tensor({n, 2}, 20 + n, d, -3.0f, 3.0f);
      Tensor dy = random_tensor({n, 2}, 30 + n, d);
      Tensor dx = square_backward(dy, x);
      ASSERT_EQ(dx.dtype(), d);
      const std::vector<double> xv = to_doubles(x), dyv = to_doubles(dy), dxv = to_doubles(dx);
      const double h = 1e-4;
      for (size_t i = 0; i < xv.size(); ++i) {
        // The central difference of x^2 in float64 is exact up to rounding: dy * ((x+h)^2 - (x-h)^2) / 2h.
        const double want = dyv[i] * ((xv[i] + h) * (xv[i] + h) - (xv[i] - h) * (xv[i] - h)) / (2 * h);
        // Two float32 products (doubling exact), one rounding into d.
        EXPECT_NEAR(dxv[i], want, (unit(d) + 0x1p-23) * std::fabs(want) + subnormal_step(d) / 2 + 1e-9) << dtype_name(d);
      }
    }
}

TEST(Square, Float16OverflowsAsItsArithmeticDoes) {
  Tensor x = Tensor::from_floats({3}, {255.0f, 256.0f, -300.0f}).to(DType::kFloat16);
  const std::vector<float> y = square(x).to_floats();
  EXPECT_EQ(y[0], 65024.0f);  // 255^2 = 65025 rounds to float16's 65024
  EXPECT_EQ(y[1], std::numeric_limits<float>::infinity());
  EXPECT_EQ(y[2], std::numeric_limits<float>::infinity());
}

TEST(Square, ReadsViewsAndAFloat32GradientForA16BitInput) {
  Tensor x = random_tensor({7, 17}, 3, DType::kBFloat16).transpose(0, 1);  // (17, 7), strided
  EXPECT_EQ(square(x).to_floats(), square(x.contiguous()).to_floats());
  Tensor dy = random_tensor({17, 7}, 4, DType::kFloat32);
  Tensor dx = square_backward(dy, x);
  EXPECT_EQ(dx.dtype(), DType::kBFloat16);
  const std::vector<float> xv = x.contiguous().to_floats(), dyv = dy.to_floats(), dxv = dx.to_floats();
  for (size_t i = 0; i < xv.size(); ++i) {
    const float want = Tensor::from_floats({1}, {dyv[i] * (2.0f * xv[i])}).to(DType::kBFloat16).to_floats()[0];
    EXPECT_EQ(dxv[i], want) << i;
  }
}

TEST(Square, RefusesIntegersAndMismatchedGradients) {
  EXPECT_THROW(square(Tensor::zeros({2}, DType::kInt32)), Error);
  EXPECT_THROW(square_backward(Tensor::zeros({3}, DType::kFloat32), Tensor::zeros({2}, DType::kFloat32)), Error);
  EXPECT_THROW(square(Tensor()), Error);
  EXPECT_EQ(square(Tensor::zeros({0, 3}, DType::kFloat16)).shape(), Shape({0, 3}));
}

}  // namespace
}  // namespace mixtrain::ops
