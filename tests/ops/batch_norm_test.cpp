// Batch normalization against float64 references, in every floating dtype, on odd shapes.
#include <gtest/gtest.h>

#include <cmath>

#include "mixtrain/core/random.h"
#include "mixtrain/ops/batch_norm.h"

#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::random_tensor;
using testing::unit;

struct Moments {
  std::vector<double> mean, var;
};
Moments moments(const std::vector<float>& x, int64_t c) {
  const int64_t rows = static_cast<int64_t>(x.size()) / c;
  Moments m{std::vector<double>(static_cast<size_t>(c), 0.0), std::vector<double>(static_cast<size_t>(c), 0.0)};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < c; ++j) m.mean[static_cast<size_t>(j)] += x[static_cast<size_t>(r * c + j)];
  for (double& v : m.mean) v /= static_cast<double>(rows);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < c; ++j) {
      const double d = x[static_cast<size_t>(r * c + j)] - m.mean[static_cast<size_t>(j)];
      m.var[static_cast<size_t>(j)] += d * d;
    }
  for (double& v : m.var) v /= static_cast<double>(rows);
  return m;
}

// Rows of float32 sums: a relative error of about rows * 2^-24 in the statistics. The inputs have a
// large mean (3) against unit spread so that a one-pass E[x^2] - E[x]^2 would fail the variance check.
TEST(BatchNorm, TrainingForwardAndBackwardMatchFloat64InEveryDType) {
  constexpr float kEps = 1e-3f;
  for (DType d : kFloatDTypes)
    for (const Shape& s : {Shape{2, 7, 5, 3}, Shape{31, 17}, Shape{3, 9, 11, 1}, Shape{1, 1, 1, 5}, Shape{129, 7}}) {
      const int64_t c = s[-1], rows = s.numel() / c;
      Tensor x = random_tensor(s, 1, d, 2.0f, 4.0f);
      Tensor gamma = random_tensor({c}, 2, DType::kFloat32, 0.5f, 1.5f), beta = random_tensor({c}, 3, DType::kFloat32);
      const std::vector<float> xv = x.to_floats(), gv = gamma.to_floats(), bv = beta.to_floats();
      const Moments m = moments(xv, c);
      const std::string what = std::string(dtype_name(d)) + " " + s.to_string();

      const BatchNormStats st = batch_moments(x);
      ASSERT_EQ(st.mean.dtype(), DType::kFloat32);
      const std::vector<float> mean = st.mean.to_floats(), var = st.variance.to_floats();
      const double stat_tol = (rows + 4) * 0x1p-24;
      for (int64_t j = 0; j < c; ++j) {
        EXPECT_NEAR(mean[static_cast<size_t>(j)], m.mean[static_cast<size_t>(j)], stat_tol * 4) << what;
        EXPECT_NEAR(var[static_cast<size_t>(j)], m.var[static_cast<size_t>(j)], stat_tol * 4) << what;
      }

      Tensor y = batch_norm(x, st.mean, st.variance, gamma, beta, kEps);
      ASSERT_EQ(y.dtype(), d);
      const std::vector<float> yv = y.to_floats();
      Tensor dy = random_tensor(s, 4, d);
      const std::vector<float> g = dy.to_floats();
      std::vector<double> sdy(static_cast<size_t>(c), 0.0), sdyx(static_cast<size_t>(c), 0.0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < c; ++j) {
          const size_t i = static_cast<size_t>(r * c + j), jj = static_cast<size_t>(j);
          const double is = 1.0 / std::sqrt(m.var[jj] + kEps), xhat = (xv[i] - m.mean[jj]) * is;
          const double want = xhat * gv[jj] + bv[jj];
          // xhat's error is dominated by the mean's (4 * 2^-24 * 4 absolute on x ~ 3, over std ~ 0.6).
          ASSERT_NEAR(yv[i], want, 2 * unit(d) * std::fabs(want) + 64 * stat_tol) << what << " y[" << i << "]";
          sdy[jj] += g[i];
          sdyx[jj] += g[i] * xhat;
        }

      const BatchNormGrads gr = batch_norm_backward(dy, x, st.mean, st.variance, gamma, kEps, true, true);
      ASSERT_EQ(gr.dx.dtype(), d);
      ASSERT_EQ(gr.dgamma.dtype(), DType::kFloat32);
      const std::vector<float> dx = gr.dx.to_floats(), dg = gr.dgamma.to_floats(), db = gr.dbeta.to_floats();
      for (int64_t j = 0; j < c; ++j) {
        const size_t jj = static_cast<size_t>(j);
        EXPECT_NEAR(db[jj], sdy[jj], (rows + 2) * 0x1p-24 * rows) << what;
        EXPECT_NEAR(dg[jj], sdyx[jj], 64 * stat_tol * rows) << what;
      }
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < c; ++j) {
          const size_t i = static_cast<size_t>(r * c + j), jj = static_cast<size_t>(j);
          const double is = 1.0 / std::sqrt(m.var[jj] + kEps), xhat = (xv[i] - m.mean[jj]) * is;
          const double want = gv[jj] * is * (g[i] - sdy[jj] / rows - xhat * sdyx[jj] / rows);
          // Cancels three O(1) terms: an absolute float32 error of ~64 rows 2^-24, then one rounding.
          ASSERT_NEAR(dx[i], want, 2 * unit(d) * std::fabs(want) + 256 * stat_tol) << what << " dx[" << i << "]";
        }
    }
}

TEST(BatchNorm, InferenceUsesTheGivenStatistics) {
  for (DType d : kFloatDTypes) {
    Tensor x = random_tensor({5, 3, 7}, 5, d, -2, 2);
    Tensor mean = Tensor::from_floats({7}, {0.1f, -0.2f, 0.3f, 0.0f, 1.0f, -1.0f, 0.5f});
    Tensor var = Tensor::from_floats({7}, {1.0f, 2.0f, 0.5f, 0.1f, 4.0f, 1.5f, 0.9f});
    Tensor gamma = random_tensor({7}, 6, DType::kFloat32), beta = random_tensor({7}, 7, DType::kFloat32);
    const std::vector<float> xv = x.to_floats(), mv = mean.to_floats(), vv = var.to_floats(), gv = gamma.to_floats(),
                             bv = beta.to_floats();
    const std::vector<float> y = batch_norm(x, mean, var, gamma, beta, 1e-3f).to_floats();
    Tensor dy = random_tensor(x.shape(), 8, d);
    const BatchNormGrads gr = batch_norm_backward(dy, x, mean, var, gamma, 1e-3f, false, true);
    const std::vector<float> dyv = dy.to_floats(), dx = gr.dx.to_floats();
    for (size_t i = 0; i < xv.size(); ++i) {
      const size_t j = i % 7;
      const double is = 1.0 / std::sqrt(static_cast<double>(vv[j]) + 1e-3);
      const double want = (xv[i] - mv[j]) * is * gv[j] + bv[j];
      EXPECT_NEAR(y[i], want, 2 * unit(d) * std::fabs(want) + 1e-5) << dtype_name(d);
      const double dwant = dyv[i] * gv[j] * is;  // statistics are constants
      EXPECT_NEAR(dx[i], dwant, 2 * unit(d) * std::fabs(dwant) + 1e-5) << dtype_name(d);
    }
  }
}

// A synchronized layer's parts. The channel sums are batch_moments' passes before their 1 / rows (its bits on one
// rank), and the sums of two halves of a batch add up to the whole batch's within float32 reordering; dx from
// given sums is the backward's when the sums are the batch's own, and otherwise the float64 formula with them.
TEST(BatchNorm, ChannelSumsAndInputGradFromGivenSums) {
  constexpr float kEps = 1e-3f;
  for (DType d : kFloatDTypes)
    for (const Shape& s : {Shape{2, 7, 5, 3}, Shape{600, 9}, Shape{1, 1, 1, 5}}) {
      const int64_t c = s[-1], rows = s.numel() / c;
      const std::string what = std::string(dtype_name(d)) + " " + s.to_string();
      Tensor x = random_tensor(s, 11, d, 2.0f, 4.0f);
      const BatchNormStats st = batch_moments(x);
      const float inv_rows = 1.0f / static_cast<float>(rows);
      const std::vector<float> sums = batch_channel_sums(x).to_floats();
      const std::vector<float> squares = batch_channel_sums(x, st.mean).to_floats();
      const std::vector<float> mean = st.mean.to_floats(), var = st.variance.to_floats();
      for (int64_t j = 0; j < c; ++j) {
        const size_t k = static_cast<size_t>(j);
        EXPECT_EQ(sums[k] * inv_rows, mean[k]) << what;
        EXPECT_EQ(squares[k] * inv_rows, var[k]) << what;
      }
      if (rows > 1) {
        const Tensor flat = x.reshape({rows, c});
        const int64_t half = rows / 2;
        const Tensor a = flat.slice(0, 0, half).contiguous(), b = flat.slice(0, half, rows).contiguous();
        const std::vector<float> sa = batch_channel_sums(a).to_floats(), sb = batch_channel_sums(b).to_floats();
        const std::vector<float> qa = batch_channel_sums(a, st.mean).to_floats();
        const std::vector<float> qb = batch_channel_sums(b, st.mean).to_floats();
        for (size_t k = 0; k < static_cast<size_t>(c); ++k) {
          EXPECT_NEAR(sa[k] + sb[k], sums[k], (rows + 2) * 0x1p-24 * std::fabs(sums[k])) << what;
          EXPECT_NEAR(qa[k] + qb[k], squares[k], (rows + 2) * 0x1p-24 * squares[k]) << what;
        }
      }

      Tensor gamma = random_tensor({c}, 12, DType::kFloat32, 0.5f, 1.5f);
      Tensor dy = random_tensor(s, 13, d);
      const BatchNormGrads own = batch_norm_backward(dy, x, st.mean, st.variance, gamma, kEps, true, true);
      const Tensor from_own = batch_norm_input_grad(dy, x, st.mean, st.variance, gamma, kEps, own.dbeta, own.dgamma);
      ASSERT_EQ(from_own.dtype(), d);
      EXPECT_EQ(from_own.to_floats(), own.dx.to_floats()) << what;

      const Tensor sum_dy = random_tensor({c}, 14, DType::kFloat32, -3.0f, 3.0f);
      const Tensor sum_dyx = random_tensor({c}, 15, DType::kFloat32, -3.0f, 3.0f);
      const std::vector<float> dx =
          batch_norm_input_grad(dy, x, st.mean, st.variance, gamma, kEps, sum_dy, sum_dyx).to_floats();
      const std::vector<float> xv = x.to_floats(), dyv = dy.to_floats(), gv = gamma.to_floats();
      const std::vector<float> sdy = sum_dy.to_floats(), sdyx = sum_dyx.to_floats();
      for (size_t i = 0; i < xv.size(); ++i) {
        const size_t j = i % static_cast<size_t>(c);
        const double is = 1.0 / std::sqrt(static_cast<double>(var[j]) + kEps);
        const double xhat = (xv[i] - static_cast<double>(mean[j])) * is;
        const double want = gv[j] * is * (dyv[i] - (sdy[j] + xhat * sdyx[j]) / static_cast<double>(rows));
        // float32 arithmetic on terms up to |sum| / rows * |xhat| (~3), rounded once into d.
        EXPECT_NEAR(dx[i], want, 2 * unit(d) * std::fabs(want) + 64 * 0x1p-24 * (1 + std::fabs(want))) << what;
      }
    }
}

TEST(BatchNorm, BadArgumentsThrow) {
  Tensor x = Tensor::zeros({4, 3}, DType::kFloat16);
  Tensor v3 = Tensor::zeros({3}, DType::kFloat32);
  EXPECT_THROW(batch_norm(x, Tensor::zeros({2}, DType::kFloat32), v3, v3, v3, 1e-3f), Error);
  EXPECT_THROW(batch_norm(x, v3, v3, Tensor::zeros({3}, DType::kFloat16), v3, 1e-3f), Error);
  EXPECT_THROW(batch_moments(Tensor::zeros({0, 3}, DType::kFloat32)), Error);
  EXPECT_THROW(batch_norm_backward(Tensor::zeros({4, 2}, DType::kFloat16), x, v3, v3, v3, 1e-3f, true, true), Error);
  EXPECT_THROW(batch_channel_sums(x, Tensor::zeros({2}, DType::kFloat32)), Error);
  EXPECT_THROW(batch_channel_sums(Tensor::zeros({4, 3}, DType::kInt32)), Error);
  EXPECT_THROW(batch_norm_input_grad(x, x, v3, v3, v3, 1e-3f, v3, Tensor::zeros({3}, DType::kFloat16)), Error);
  EXPECT_THROW(batch_norm_input_grad(Tensor::zeros({4, 2}, DType::kFloat16), x, v3, v3, v3, 1e-3f, v3, v3), Error);
}

}  // namespace
}  // namespace mixtrain::ops
