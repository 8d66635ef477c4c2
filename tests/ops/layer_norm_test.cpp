// Layer normalization against float64 references, in every floating dtype, on odd shapes; rows with a
// large mean (where one-pass statistics or 16-bit arithmetic would fail); thread-count independence.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "mixtrain/ops/layer_norm.h"

#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::random_tensor;
using testing::subnormal_step;
using testing::unit;

struct RowStats {
  double mean, rstd;
};

RowStats row_stats(const float* x, int64_t d, double eps) {
  double s = 0;
  for (int64_t j = 0; j < d; ++j) s += x[j];
  const double mean = s / static_cast<double>(d);
  double v = 0;
  for (int64_t j = 0; j < d; ++j) v += (x[j] - mean) * (x[j] - mean);
  return {mean, 1.0 / std::sqrt(v / static_cast<double>(d) + eps)};
}

// Relative error of the float32 statistics, as seen through xhat = (x - mean) * rstd: the mean of d float32
// terms is off by up to (d + 4) 2^-24 |mean|, which moves xhat by that times rstd; rstd itself is off by
// about (d + 4) 2^-24 relatively. Both are far below what a one-pass variance (E[x^2] - E[x]^2) would lose
// on these rows (their mean is 1000 times their spread: it loses all but a few bits of the variance).
double stat_error(int64_t d, const RowStats& s) {
  return (static_cast<double>(d) + 4) * 0x1p-24 * (1.0 + std::fabs(s.mean) * s.rstd);
}

struct Case {
  Shape shape;
  float lo, hi;  // input range: a large offset puts the mean far from zero
};
const Case kCases[] = {{{1, 1}, -1, 1},       {{7, 17}, -1, 1},       {{2, 3, 31}, 999, 1001},
                       {{31, 7}, -3, 5},       {{3, 129}, 1999, 2001}, {{129, 1}, -2, 2},
                       {{2, 5, 64}, -0.01f, 0.01f}};

TEST(LayerNorm, ForwardAndBackwardMatchFloat64InEveryDType) {
  constexpr float kEps = 1e-3f;
  for (DType dt : kFloatDTypes)
    for (const Case& c : kCases) {
      const int64_t d = c.shape[-1], rows = c.shape.numel() / d;
      const std::string what = std::string(dtype_name(dt)) + " " + c.shape.to_string();
      Tensor x = random_tensor(c.shape, 1, dt, c.lo, c.hi);
      Tensor gamma = random_tensor({d}, 2, DType::kFloat32, 0.5f, 1.5f), beta = random_tensor({d}, 3, DType::kFloat32);
      Tensor dy = random_tensor(c.shape, 4, dt);
      const std::vector<float> xv = x.to_floats(), gv = gamma.to_floats(), bv = beta.to_floats(), g = dy.to_floats();

      const LayerNormOutput out = layer_norm(x, gamma, beta, kEps);
      ASSERT_EQ(out.y.dtype(), dt);
      ASSERT_EQ(out.y.shape(), c.shape);
      ASSERT_EQ(out.mean.dtype(), DType::kFloat32);
      ASSERT_EQ(out.rstd.shape(), Shape({rows}));
      const std::vector<float> yv = out.y.to_floats(), mv = out.mean.to_floats(), rv = out.rstd.to_floats();

      const LayerNormGrads gr = layer_norm_backward(dy, x, out.mean, out.rstd, gamma, true);
      ASSERT_EQ(gr.dx.dtype(), dt);
      ASSERT_EQ(gr.dgamma.dtype(), DType::kFloat32);
      const std::vector<float> dx = gr.dx.to_floats(), dg = gr.dgamma.to_floats(), db = gr.dbeta.to_floats();
      std::vector<double> want_dg(static_cast<size_t>(d), 0.0), want_db(want_dg.size(), 0.0), mag(want_dg.size(), 0.0);
      double worst_stat = 0;

      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = xv.data() + r * d;
        const RowStats s = row_stats(xr, d, kEps);
        const double es = stat_error(d, s);
        worst_stat = std::max(worst_stat, es);
        ASSERT_NEAR(mv[static_cast<size_t>(r)], s.mean, (d + 4) * 0x1p-24 * std::fabs(s.mean) + 1e-30) << what;
        ASSERT_NEAR(rv[static_cast<size_t>(r)], s.rstd, 4 * es * s.rstd) << what;
        // dx = rstd * (gg - mean(gg) - xhat * mean(gg * xhat)) with gg = dy * gamma.
        std::vector<double> xhat(static_cast<size_t>(d)), gg(static_cast<size_t>(d));
        double mean_g = 0, mean_gx = 0, max_g = 0, max_xhat = 0;
        for (int64_t j = 0; j < d; ++j) {
          const size_t i = static_cast<size_t>(r * d + j), jj = static_cast<size_t>(j);
          xhat[jj] = (xr[j] - s.mean) * s.rstd;
          gg[jj] = static_cast<double>(g[i]) * gv[jj];
          mean_g += gg[jj] / static_cast<double>(d);
          mean_gx += gg[jj] * xhat[jj] / static_cast<double>(d);
          max_g = std::max(max_g, std::fabs(gg[jj]));
          max_xhat = std::max(max_xhat, std::fabs(xhat[jj]));
          want_dg[jj] += g[i] * xhat[jj];
          want_db[jj] += g[i];
          mag[jj] += std::fabs(g[i]) * (1.0 + std::fabs(xhat[jj]));
          const double want = xhat[jj] * gv[jj] + bv[jj];
          // One rounding into dt, plus the statistics' error moving xhat (times gamma <= 1.5).
          ASSERT_NEAR(yv[i], want, 2 * unit(dt) * std::fabs(want) + 4 * es * (1 + std::fabs(xhat[jj])))
              << what << " y[" << i << "]";
        }
        // dx: terms of size rstd * max_g * (1 + max_xhat^2), each off by the statistics' error and by
        // float32 sums over d; one rounding into dt.
        const double scale_dx = s.rstd * max_g * (2 + max_xhat * max_xhat);
        for (int64_t j = 0; j < d; ++j) {
          const size_t i = static_cast<size_t>(r * d + j), jj = static_cast<size_t>(j);
          const double want = s.rstd * (gg[jj] - mean_g - xhat[jj] * mean_gx);
          ASSERT_NEAR(dx[i], want, 2 * unit(dt) * std::fabs(want) + 8 * es * scale_dx + subnormal_step(dt))
              << what << " dx[" << i << "]";
        }
      }
      for (int64_t j = 0; j < d; ++j) {
        const size_t jj = static_cast<size_t>(j);
        const double tol = ((rows + 4) * 0x1p-24 + 4 * worst_stat) * mag[jj];
        ASSERT_NEAR(dg[jj], want_dg[jj], tol) << what << " dgamma[" << j << "]";
        ASSERT_NEAR(db[jj], want_db[jj], (rows + 4) * 0x1p-24 * mag[jj]) << what << " dbeta[" << j << "]";
      }
      // Without dx: the same parameter gradients, bit for bit.
      const LayerNormGrads no_dx = layer_norm_backward(dy, x, out.mean, out.rstd, gamma, false);
      EXPECT_FALSE(no_dx.dx.defined());
      EXPECT_EQ(no_dx.dgamma.to_floats(), dg);
      EXPECT_EQ(no_dx.dbeta.to_floats(), db);
    }
}

// The spread of a float16 row around a mean of 1000 survives: normalized to unit variance, not lost.
TEST(LayerNorm, Float16RowWithLargeMeanNormalizesToUnitVariance) {
  std::vector<float> v(64);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 1000.0f + (i % 2 ? 0.5f : -0.5f);  // exact in float16
  Tensor x = Tensor::from_floats({1, 64}, v, DType::kFloat16);
  const LayerNormOutput out = layer_norm(x, Tensor::full({64}, DType::kFloat32, 1.0f), Tensor::zeros({64}, DType::kFloat32), 0.0f);
  const std::vector<float> y = out.y.to_floats();
  for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], i % 2 ? 1.0f : -1.0f) << i;
  EXPECT_EQ(out.mean.at(0), 1000.0f);
}

TEST(LayerNorm, ViewsAndInvalidArguments) {
  Tensor base = random_tensor({6, 5}, 5, DType::kFloat32);
  Tensor x = base.transpose(0, 1);  // (5, 6), not contiguous
  Tensor gamma = random_tensor({6}, 6, DType::kFloat32), beta = random_tensor({6}, 7, DType::kFloat32);
  EXPECT_EQ(layer_norm(x, gamma, beta, 1e-3f).y.to_floats(), layer_norm(x.contiguous(), gamma, beta, 1e-3f).y.to_floats());
  EXPECT_THROW(layer_norm(x, random_tensor({5}, 8, DType::kFloat32), beta, 1e-3f), Error);    // wrong width
  EXPECT_THROW(layer_norm(x, gamma.to(DType::kFloat16), beta, 1e-3f), Error);                  // gamma not float32
  EXPECT_THROW(layer_norm(x, gamma, beta, -1.0f), Error);
  EXPECT_THROW(layer_norm(Tensor::from_ints({2}, {1, 2}), gamma, beta, 1e-3f), Error);
  const LayerNormOutput out = layer_norm(x, gamma, beta, 1e-3f);
  EXPECT_THROW(layer_norm_backward(random_tensor({5, 5}, 9, DType::kFloat32), x, out.mean, out.rstd, gamma, true), Error);
  EXPECT_THROW(layer_norm_backward(random_tensor({5, 6}, 9, DType::kFloat32), x, out.rstd.slice(0, 0, 4), out.rstd, gamma,
                                   true),
               Error);
}

TEST(LayerNorm, ResultsDoNotDependOnTheThreadCount) {
  Tensor x = random_tensor({300, 129}, 10, DType::kBFloat16, -2.0f, 3.0f);
  Tensor gamma = random_tensor({129}, 11, DType::kFloat32), beta = random_tensor({129}, 12, DType::kFloat32);
  Tensor dy = random_tensor({300, 129}, 13, DType::kBFloat16);
  const int saved = omp_get_max_threads();
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    const LayerNormOutput out = layer_norm(x, gamma, beta, 1e-3f);
    const LayerNormGrads g = layer_norm_backward(dy, x, out.mean, out.rstd, gamma, true);
    std::vector<float> all = out.y.to_floats();
    for (const Tensor& t : {out.mean, out.rstd, g.dx, g.dgamma, g.dbeta}) {
      const std::vector<float> f = t.to_floats();
      all.insert(all.end(), f.begin(), f.end());
    }
    results.push_back(all);
  }
  omp_set_num_threads(saved);
  for (size_t i = 1; i < results.size(); ++i)
    EXPECT_EQ(0, std::memcmp(results[0].data(), results[i].data(), results[0].size() * sizeof(float)));
}

}  // namespace
}  // namespace mixtrain::ops
