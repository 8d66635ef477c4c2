// RMS normalization against float64 references, in every floating dtype, on odd shapes; the backward against
// float64 finite differences; float16 rows whose squares overflow float16; views; thread-count independence.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "mixtrain/ops/rms_norm.h"

#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::random_tensor;
using testing::subnormal_step;
using testing::unit;

// 1 / sqrt(mean(x^2) + eps) of a row, in float64.
double row_rstd(const double* x, int64_t d, double eps) {
  double s = 0;
  for (int64_t j = 0; j < d; ++j) s += x[j] * x[j];
  return 1.0 / std::sqrt(s / static_cast<double>(d) + eps);
}

// sum_j dy_j * y_j of one row in float64: the scalar whose gradient the backward computes.
double row_loss(const double* x, const double* dy, const float* scale, int64_t d, double eps) {
  const double rs = row_rstd(x, d, eps);
  double l = 0;
  for (int64_t j = 0; j < d; ++j) l += dy[j] * x[j] * rs * scale[j];
  return l;
}

const Shape kShapes[] = {{1, 1}, {7, 17}, {2, 3, 31}, {31, 7}, {3, 129}, {129, 1}, {2, 5, 64}};

TEST(RmsNorm, ForwardAndBackwardMatchFloat64InEveryDType) {
  constexpr float kEps = 1e-6f;
  for (DType dt : kFloatDTypes)
    for (const Shape& shape : kShapes) {
      const int64_t d = shape[-1], rows = shape.numel() / d;
      const std::string what = std::string(dtype_name(dt)) + " " + shape.to_string();
      Tensor x = random_tensor(shape, 1, dt, -3.0f, 2.0f);
      Tensor scale = random_tensor({d}, 2, DType::kFloat32, 0.5f, 1.5f);
      Tensor dy = random_tensor(shape, 4, dt);
      const std::vector<float> xv = x.to_floats(), sv = scale.to_floats(), g = dy.to_floats();

      const RmsNormOutput out = rms_norm(x, scale, kEps);
      ASSERT_EQ(out.y.dtype(), dt);
      ASSERT_EQ(out.y.shape(), shape);
      ASSERT_EQ(out.rstd.shape(), Shape({rows}));
      const RmsNormGrads gr = rms_norm_backward(dy, x, out.rstd, scale, true);
      ASSERT_EQ(gr.dx.dtype(), dt);
      ASSERT_EQ(gr.dscale.dtype(), DType::kFloat32);
      const std::vector<float> yv = out.y.to_floats(), rv = out.rstd.to_floats(), dx = gr.dx.to_floats();
      const std::vector<float> ds = gr.dscale.to_floats();
      std::vector<double> want_ds(static_cast<size_t>(d), 0.0), mag(want_ds.size(), 0.0);
      // The float32 sum of d squares is off by up to (d + 4) 2^-24 relatively; rstd by half that plus its own
      // roundings, which moves xhat = x * rstd by as much.
      const double es = (static_cast<double>(d) + 8) * 0x1p-24;
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<double> xr(xv.begin() + r * d, xv.begin() + (r + 1) * d);
        const double rs = row_rstd(xr.data(), d, kEps);
        ASSERT_NEAR(rv[static_cast<size_t>(r)], rs, es * rs) << what;
        double mean_gx = 0, max_g = 0;
        for (int64_t j = 0; j < d; ++j) {
          const size_t i = static_cast<size_t>(r * d + j), jj = static_cast<size_t>(j);
          const double xhat = xr[jj] * rs, gg = static_cast<double>(g[i]) * sv[jj];
          mean_gx += gg * xhat / static_cast<double>(d);
          max_g = std::max(max_g, std::fabs(gg));
          want_ds[jj] += g[i] * xhat;
          mag[jj] += std::fabs(g[i] * xhat);
          const double want = xhat * sv[jj];
          // One rounding into dt, plus the float32 statistic's error.
          ASSERT_NEAR(yv[i], want, 2 * unit(dt) * std::fabs(want) + 2 * es * std::fabs(want) + subnormal_step(dt))
              << what << " y[" << i << "]";
        }
        // dx: terms of size rstd * max_g * (1 + xhat^2 <= d), each off by the statistic's error and by the float32
        // sum over d; one rounding into dt.
        const double scale_dx = rs * max_g * (1 + static_cast<double>(d));
        for (int64_t j = 0; j < d; ++j) {
          const size_t i = static_cast<size_t>(r * d + j), jj = static_cast<size_t>(j);
          const double want = rs * (static_cast<double>(g[i]) * sv[jj] - xr[jj] * rs * mean_gx);
          ASSERT_NEAR(dx[i], want, 2 * unit(dt) * std::fabs(want) + 4 * es * scale_dx + subnormal_step(dt))
              << what << " dx[" << i << "]";
        }
      }
      for (int64_t j = 0; j < d; ++j) {  // float32 column sums over rows, each term off by the statistic's error
        const size_t jj = static_cast<size_t>(j);
        ASSERT_NEAR(ds[jj], want_ds[jj], ((rows + 4) * 0x1p-24 + 2 * es) * mag[jj] + 1e-30) << what << " dscale";
      }
      const RmsNormGrads no_dx = rms_norm_backward(dy, x, out.rstd, scale, false);
      EXPECT_FALSE(no_dx.dx.defined());
      EXPECT_EQ(no_dx.dscale.to_floats(), ds);  // the same bits without dx
    }
}

// The backward's formula against float64 central differences of the float64 forward: an independent check of the
// derivative itself (the test above checks the kernels against the same closed form they implement).
TEST(RmsNorm, BackwardMatchesFloat64FiniteDifferences) {
  constexpr float kEps = 1e-6f;
  for (const Shape& shape : {Shape{3, 5}, Shape{2, 17}, Shape{1, 1}, Shape{4, 33}}) {
    const int64_t d = shape[-1], rows = shape.numel() / d;
    Tensor x = random_tensor(shape, 21, DType::kFloat32, -2.0f, 2.0f);
    Tensor scale = random_tensor({d}, 22, DType::kFloat32, 0.5f, 1.5f), dy = random_tensor(shape, 23, DType::kFloat32);
    const RmsNormOutput out = rms_norm(x, scale, kEps);
    const RmsNormGrads gr = rms_norm_backward(dy, x, out.rstd, scale, true);
    const std::vector<float> xv = x.to_floats(), sv = scale.to_floats(), gv = dy.to_floats(), dx = gr.dx.to_floats();
    const std::vector<float> ds = gr.dscale.to_floats();
    std::vector<double> fd_ds(static_cast<size_t>(d), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<double> xr(xv.begin() + r * d, xv.begin() + (r + 1) * d);
      const std::vector<double> gr64(gv.begin() + r * d, gv.begin() + (r + 1) * d);
      for (int64_t j = 0; j < d; ++j) {
        const size_t jj = static_cast<size_t>(j);
        const double h = 1e-6, keep = xr[jj];
        xr[jj] = keep + h;
        const double up = row_loss(xr.data(), gr64.data(), sv.data(), d, kEps);
        xr[jj] = keep - h;
        const double down = row_loss(xr.data(), gr64.data(), sv.data(), d, kEps);
        xr[jj] = keep;
        const double want = (up - down) / (2 * h);  // O(h^2) truncation, 1e-10 cancellation: far below the tolerance
        EXPECT_NEAR(dx[static_cast<size_t>(r * d + j)], want, 1e-5 * (1 + std::fabs(want)))
            << shape << " dx " << r << "," << j;
        fd_ds[jj] += gr64[jj] * xr[jj] * row_rstd(xr.data(), d, kEps);  // y is linear in scale_j: dL/dscale_j exactly
      }
    }
    for (int64_t j = 0; j < d; ++j)  // float32 sums of a few terms of size <= 2
      EXPECT_NEAR(ds[static_cast<size_t>(j)], fd_ds[static_cast<size_t>(j)], 1e-5) << shape << " dscale " << j;
  }
}

// Every element 300 in float16: its square (90000) overflows float16's 65504, the float32 statistic does not, and
// the row normalizes to scale exactly (rstd = 1/300 up to float32 rounding, then one rounding into float16).
TEST(RmsNorm, Float16RowWhoseSquaresOverflowFloat16NormalizesToOne) {
  Tensor x = Tensor::full({2, 40}, DType::kFloat16, 300.0f);
  const RmsNormOutput out = rms_norm(x, Tensor::full({40}, DType::kFloat32, 1.0f), 0.0f);
  for (float v : out.y.to_floats()) EXPECT_EQ(v, 1.0f);
  EXPECT_NEAR(out.rstd.at(0), 1.0 / 300.0, 0x1p-22 / 300.0);
}

TEST(RmsNorm, ViewsAndInvalidArguments) {
  Tensor base = random_tensor({6, 5}, 5, DType::kFloat32);
  Tensor x = base.transpose(0, 1);  // (5, 6), not contiguous
  Tensor scale = random_tensor({6}, 6, DType::kFloat32);
  EXPECT_EQ(rms_norm(x, scale, 1e-6f).y.to_floats(), rms_norm(x.contiguous(), scale, 1e-6f).y.to_floats());
  EXPECT_THROW(rms_norm(x, random_tensor({5}, 8, DType::kFloat32), 1e-6f), Error);  // wrong width
  EXPECT_THROW(rms_norm(x, scale.to(DType::kFloat16), 1e-6f), Error);               // scale not float32
  EXPECT_THROW(rms_norm(x, scale, -1.0f), Error);
  EXPECT_THROW(rms_norm(Tensor::from_ints({2}, {1, 2}), scale, 1e-6f), Error);
  const RmsNormOutput out = rms_norm(x, scale, 1e-6f);
  EXPECT_THROW(rms_norm_backward(random_tensor({5, 5}, 9, DType::kFloat32), x, out.rstd, scale, true), Error);
  EXPECT_THROW(rms_norm_backward(random_tensor({5, 6}, 9, DType::kFloat32), x, out.rstd.slice(0, 0, 4), scale, true),
               Error);
}

TEST(RmsNorm, ResultsDoNotDependOnTheThreadCount) {
  Tensor x = random_tensor({300, 129}, 10, DType::kBFloat16, -2.0f, 3.0f);
  Tensor scale = random_tensor({129}, 11, DType::kFloat32), dy = random_tensor({300, 129}, 13, DType::kBFloat16);
  const int saved = omp_get_max_threads();
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    const RmsNormOutput out = rms_norm(x, scale, 1e-6f);
    const RmsNormGrads g = rms_norm_backward(dy, x, out.rstd, scale, true);
    std::vector<float> all = out.y.to_floats();
    for (const Tensor& t : {out.rstd, g.dx, g.dscale}) {
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
