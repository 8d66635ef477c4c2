// reduce_sum over each axis against float64, in every floating dtype, on odd shapes and views; its
// backward against the float64 finite difference of the sum.
#include <gtest/gtest.h>

#include <cmath>

#include "mixtrain/ops/reduce.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::kOddSizes;
using testing::random_tensor;
using testing::to_doubles;
using testing::unit;

TEST(ReduceSum, EveryAxisMatchesFloat64InEveryDType) {
  for (DType d : kFloatDTypes)
    for (int64_t n : kOddSizes) {
      const Shape s({3, n, 7});
      Tensor x = random_tensor(s, 1 + n, d);
      const std::vector<double> xv = to_doubles(x);
      for (int axis : {0, 1, 2, -1}) {
        const int ax = axis < 0 ? axis + 3 : axis;
        Tensor y = reduce_sum(x, axis);
        Tensor yk = reduce_sum(x, axis, /*keepdims=*/true, DType::kFloat32);
        std::vector<int64_t> dims = s.dims(), kdims = s.dims();
        dims.erase(dims.begin() + ax);
        kdims[static_cast<size_t>(ax)] = 1;
        ASSERT_EQ(y.shape(), Shape(dims));
        ASSERT_EQ(yk.shape(), Shape(kdims));
        EXPECT_EQ(y.dtype(), d);
        EXPECT_EQ(yk.dtype(), DType::kFloat32);
        const std::vector<double> yv = to_doubles(y), ykv = to_doubles(yk);
        int64_t outer = 1, inner = 1;
        for (int i = 0; i < ax; ++i) outer *= s[i];
        for (int i = ax + 1; i < 3; ++i) inner *= s[i];
        const int64_t len = s[ax];
        for (int64_t o = 0; o < outer; ++o)
          for (int64_t i = 0; i < inner; ++i) {
            double want = 0, mag = 0;
            for (int64_t j = 0; j < len; ++j) {
              want += xv[(o * len + j) * inner + i];
              mag += std::fabs(xv[(o * len + j) * inner + i]);
            }
            const size_t at = static_cast<size_t>(o * inner + i);
            // float32 sums in index order (len units of sum |x|), then one rounding into d.
            EXPECT_NEAR(yv[at], want, len * 0x1p-24 * mag + unit(d) * std::fabs(want) + 1e-12) << dtype_name(d);
            EXPECT_NEAR(ykv[at], want, len * 0x1p-24 * mag + 1e-12);
          }
      }
    }
}

TEST(ReduceSum, ReadsViews) {
  Tensor x = random_tensor({7, 17, 3}, 2, DType::kBFloat16).permute({2, 0, 1});  // (3, 7, 17)
  for (int axis : {0, 1, 2})
    EXPECT_EQ(reduce_sum(x, axis).to_floats(), reduce_sum(x.contiguous(), axis).to_floats()) << axis;
}

TEST(ReduceSum, BackwardMatchesFiniteDifferences) {
  for (DType d : kFloatDTypes)
    for (bool keepdims : {false, true}) {
      Tensor x = random_tensor({3, 7, 5}, 3, d);
      for (int axis : {0, 1, 2}) {
        Tensor y = reduce_sum(x, axis, keepdims);
        Tensor dy = random_tensor(y.shape(), 4, d);
        const std::vector<double> xv = to_doubles(x), r = to_doubles(dy);
        Tensor dx = reduce_sum_backward(dy, x, axis, keepdims);
        ASSERT_EQ(dx.shape(), x.shape());
        EXPECT_EQ(dx.dtype(), d);
        const std::vector<double> got = to_doubles(dx);
        // L = sum(reduce_sum(x) * r) in float64; the sum is linear, so central differences are exact.
        auto loss = [&](const std::vector<double>& v) {
          int64_t inner = 1, len = x.dim(axis), outer = 1;
          for (int i = 0; i < axis; ++i) outer *= x.dim(i);
          for (int i = axis + 1; i < 3; ++i) inner *= x.dim(i);
          double s = 0;
          for (int64_t o = 0; o < outer; ++o)
            for (int64_t j = 0; j < len; ++j)
              for (int64_t i = 0; i < inner; ++i) s += v[(o * len + j) * inner + i] * r[o * inner + i];
          return s;
        };
        for (size_t i = 0; i < xv.size(); ++i) {
          std::vector<double> up = xv, down = xv;
          up[i] += 0.25;
          down[i] -= 0.25;
          EXPECT_NEAR(got[i], (loss(up) - loss(down)) / 0.5, 1e-12) << dtype_name(d) << " axis " << axis;
        }
      }
    }
}

TEST(ReduceSum, RejectsBadAxes) {
  Tensor x = Tensor::zeros({2, 3}, DType::kFloat32);
  EXPECT_THROW(reduce_sum(x, 2), Error);
  EXPECT_THROW(reduce_sum(x, -3), Error);
  EXPECT_THROW(reduce_sum(Tensor::from_floats({}, {1.0f}), 0), Error);
  EXPECT_THROW(reduce_sum_backward(Tensor::zeros({3}, DType::kFloat32), x, 1), Error);
  EXPECT_EQ(reduce_sum(Tensor::zeros({2, 0, 3}, DType::kFloat32), 1).to_floats(), std::vector<float>(6, 0.0f));
}

}  // namespace
}  // namespace mixtrain::ops
