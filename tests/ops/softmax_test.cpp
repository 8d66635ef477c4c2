// Softmax and log-softmax over the last axis against float64 references, in every floating dtype.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "mixtrain/ops/softmax.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::kOddSizes;
using testing::random_tensor;
using testing::to_doubles;
using testing::unit;

// Checks softmax, log_softmax and both backward passes of x (..., cols) against float64, row by row.
void check_against_float64(const Tensor& x, uint64_t seed) {
  const DType d = x.dtype();
  const int64_t cols = x.dim(-1), rows = x.numel() / cols;
  const std::vector<double> in = to_doubles(x);
  Tensor y = softmax(x), ly = log_softmax(x);
  EXPECT_EQ(y.dtype(), d);
  EXPECT_EQ(y.shape(), x.shape());
  EXPECT_EQ(ly.shape(), x.shape());
  Tensor dy = random_tensor(x.shape(), seed, d);
  const std::vector<double> sm = to_doubles(y), ls = to_doubles(ly), g = to_doubles(dy);
  const std::vector<double> dsm = to_doubles(softmax_backward(dy, y)), dls = to_doubles(log_softmax_backward(dy, ly));
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = in.data() + r * cols;
    double mx = -1e300, s = 0;
    for (int64_t j = 0; j < cols; ++j) mx = std::max(mx, row[j]);
    for (int64_t j = 0; j < cols; ++j) s += std::exp(row[j] - mx);
    // Backward references from the saved outputs as stored (rounded into d), as the ops read them.
    double dot = 0, gsum = 0;
    for (int64_t j = 0; j < cols; ++j) {
      dot += g[r * cols + j] * sm[r * cols + j];
      gsum += g[r * cols + j];
    }
    for (int64_t j = 0; j < cols; ++j) {
      const size_t i = static_cast<size_t>(r * cols + j);
      const double p = std::exp(row[j] - mx) / s, lp = row[j] - mx - std::log(s);
      // float32 internals add ~cols * 2^-24 relative error before the final rounding.
      EXPECT_NEAR(sm[i], p, 2 * unit(d) * p + 1e-6) << dtype_name(d) << " cols " << cols;
      EXPECT_NEAR(ls[i], lp, 2 * unit(d) * std::fabs(lp) + 1e-5) << dtype_name(d) << " cols " << cols;
      const double dwant = sm[i] * (g[i] - dot);
      EXPECT_NEAR(dsm[i], dwant, 2 * unit(d) * std::fabs(dwant) + cols * 1e-7) << dtype_name(d) << " cols " << cols;
      const double lwant = g[i] - std::exp(ls[i]) * gsum;
      EXPECT_NEAR(dls[i], lwant, 2 * unit(d) * std::fabs(lwant) + cols * 1e-7) << dtype_name(d) << " cols " << cols;
    }
  }
}

TEST(Softmax, MatchesFloat64InEveryDType) {
  for (DType d : kFloatDTypes)
    for (int64_t cols : kOddSizes) check_against_float64(random_tensor({3, cols}, 1, d, -8, 8), 2);
}

TEST(Softmax, OverTheLastAxisOfAnyRank) {
  for (DType d : kFloatDTypes)
    for (int64_t cols : {1, 7, 31}) {
      check_against_float64(random_tensor({cols}, 3, d, -8, 8), 4);
      check_against_float64(random_tensor({2, 3, cols}, 5, d, -8, 8), 6);
      check_against_float64(random_tensor({2, 1, 3, cols}, 7, d, -8, 8), 8);
    }
}

TEST(Softmax, ReadsViews) {
  Tensor base = random_tensor({7, 2, 17}, 9, DType::kBFloat16, -4, 4);
  Tensor view = base.permute({1, 2, 0});  // (2, 17, 7)
  ASSERT_FALSE(view.is_contiguous());
  EXPECT_EQ(softmax(view).to_floats(), softmax(view.contiguous()).to_floats());
  EXPECT_EQ(log_softmax(view.slice(1, 3, 10)).to_floats(), log_softmax(view.slice(1, 3, 10).contiguous()).to_floats());
}

TEST(Softmax, LargeLogitsDoNotOverflow) {
  Tensor x = Tensor::from_floats({1, 3}, {1000.0f, 1001.0f, 0.0f}, DType::kFloat16);
  const std::vector<float> p = softmax(x).to_floats();
  EXPECT_NEAR(p[0], 1 / (1 + std::exp(1.0)), 1e-3);
  EXPECT_NEAR(p[1], 1 / (1 + std::exp(-1.0)), 1e-3);
  EXPECT_EQ(p[2], 0.0f);
}

TEST(Softmax, RejectsScalarsAndMismatchedGradients) {
  EXPECT_THROW(softmax(Tensor::from_floats({}, {1.0f})), Error);
  Tensor y = softmax(random_tensor({2, 3}, 10, DType::kFloat32));
  EXPECT_THROW(softmax_backward(Tensor::zeros({3, 2}, DType::kFloat32), y), Error);
}

}  // namespace
}  // namespace mixtrain::ops
