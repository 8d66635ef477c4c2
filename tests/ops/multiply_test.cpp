// The element-wise product against float64 in every floating dtype on odd shapes, its backward against the float64
// finite difference, views, a float32 gradient for 16-bit operands, float16 overflow and refused inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "mixtrain/ops/multiply.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::kOddSizes;
using testing::random_tensor;
using testing::subnormal_step;
using testing::to_doubles;
using testing::unit;

TEST(Multiply, MatchesFloat64InEveryDType) {
  for (DType d : kFloatDTypes)
    for (int64_t n : kOddSizes) {
      const Tensor a = random_tensor({3, n}, 10 + n, d, -4.0f, 4.0f), b = random_tensor({3, n}, 60 + n, d, -4.0f, 4.0f);
      const Tensor y = multiply(a, b);
      ASSERT_EQ(y.shape(), a.shape());
      ASSERT_EQ(y.dtype(), d);
      const std::vector<double> av = to_doubles(a), bv = to_doubles(b), yv = to_doubles(y);
      for (size_t i = 0; i < av.size(); ++i) {
        const double want = av[i] * bv[i];
        // One float32 product (exact for 16-bit operands, half a float32 unit otherwise), one rounding into d (half
        // a subnormal step where the product falls below d's normal range).
        EXPECT_NEAR(yv[i], want, (unit(d) + 0x1p-24) * std::fabs(want) + subnormal_step(d) / 2)
            << dtype_name(d) << " " << av[i] << " * " << bv[i];
      }
    }
}

TEST(Multiply, BackwardMatchesTheFiniteDifference) {
  for (DType d : kFloatDTypes)
    for (int64_t n : kOddSizes) {
      const Tensor a = random_tensor({n, 2}, 20 + n, d, -3.0f, 3.0f), b = random_tensor({n, 2}, 70 + n, d, -3.0f, 3.0f);
      const Tensor dy = random_tensor({n, 2}, 30 + n, d);
      const Tensor da = multiply_backward(dy, b), db = multiply_backward(dy, a);
      ASSERT_EQ(da.dtype(), d);
      const std::vector<double> av = to_doubles(a), bv = to_doubles(b), dyv = to_doubles(dy);
      const std::vector<double> dav = to_doubles(da), dbv = to_doubles(db);
      const double h = 1e-3;
      for (size_t i = 0; i < av.size(); ++i) {
        // Central differences of the float64 product in each operand: exact up to float64 rounding for a product.
        const double want_a = dyv[i] * ((av[i] + h) * bv[i] - (av[i] - h) * bv[i]) / (2 * h);
        const double want_b = dyv[i] * (av[i] * (bv[i] + h) - av[i] * (bv[i] - h)) / (2 * h);
        // One float32 product, one rounding into d; 1e-9 for the difference quotient's float64 error.
        EXPECT_NEAR(dav[i], want_a, (unit(d) + 0x1p-24) * std::fabs(want_a) + subnormal_step(d) / 2 + 1e-9);
        EXPECT_NEAR(dbv[i], want_b, (unit(d) + 0x1p-24) * std::fabs(want_b) + subnormal_step(d) / 2 + 1e-9);
      }
    }
}

TEST(Multiply, Float16OverflowsAsItsArithmeticDoes) {
  const Tensor a = Tensor::from_floats({2}, {255.0f, 300.0f}).to(DType::kFloat16);
  const Tensor b = Tensor::from_floats({2}, {255.0f, -300.0f}).to(DType::kFloat16);
  const std::vector<float> y = multiply(a, b).to_floats();
  EXPECT_EQ(y[0], 65024.0f);  // 65025 rounds to float16's 65024
  EXPECT_EQ(y[1], -std::numeric_limits<float>::infinity());
}

TEST(Multiply, ReadsViewsAndAFloat32GradientFor16BitOperands) {
  const Tensor a = random_tensor({7, 17}, 3, DType::kBFloat16).transpose(0, 1);  // (17, 7), strided
  const Tensor b = random_tensor({17, 7}, 5, DType::kBFloat16);
  EXPECT_EQ(multiply(a, b).to_floats(), multiply(a.contiguous(), b).to_floats());
  const Tensor dy = random_tensor({17, 7}, 4, DType::kFloat32);
  const Tensor db = multiply_backward(dy, a);
  EXPECT_EQ(db.dtype(), DType::kBFloat16);
  const std::vector<float> av = a.contiguous().to_floats(), dyv = dy.to_floats(), dbv = db.to_floats();
  for (size_t i = 0; i < av.size(); ++i) {
    const float want = Tensor::from_floats({1}, {dyv[i] * av[i]}).to(DType::kBFloat16).to_floats()[0];
    EXPECT_EQ(dbv[i], want) << i;
  }
}

TEST(Multiply, RefusesIntegersMismatchesAndUndefinedOperands) {
  EXPECT_THROW(multiply(Tensor::zeros({2}, DType::kInt32), Tensor::zeros({2}, DType::kInt32)), Error);
  EXPECT_THROW(multiply(Tensor::zeros({2}, DType::kFloat32), Tensor::zeros({3}, DType::kFloat32)), Error);
  EXPECT_THROW(multiply(Tensor::zeros({2}, DType::kFloat32), Tensor::zeros({2}, DType::kFloat16)), Error);
  EXPECT_THROW(multiply_backward(Tensor::zeros({3}, DType::kFloat32), Tensor::zeros({2}, DType::kFloat32)), Error);
  EXPECT_THROW(multiply(Tensor(), Tensor()), Error);
  EXPECT_EQ(multiply(Tensor::zeros({0, 3}, DType::kFloat16), Tensor::zeros({0, 3}, DType::kFloat16)).shape(),
            Shape({0, 3}));
}

}  // namespace
}  // namespace mixtrain::ops
