// linear_cross_entropy against a float64 reference of the projection and the loss, against the unfused ops, by
// finite differences, across chunk sizes and thread counts, and for the memory it never takes.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "mixtrain/core/allocator.h"
#include "mixtrain/ops/linear_cross_entropy.h"
#include "mixtrain/ops/losses.h"
#include "mixtrain/ops/matmul.h"
#include "linear_cross_entropy_problem.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::random_tensor;
using testing::unit;

using Problem = testing::LinearCrossEntropyProblem;
Problem make_problem(int64_t n, int64_t d, int64_t v, DType dt, uint64_t seed) {
  return testing::make_linear_cross_entropy_problem(n, d, v, dt, seed, seed + 7);
}

// Float64 loss, gradients (times seed) and, per gradient element, the sum of the magnitudes of its terms (the
// scale of its rounding error), from the inputs' exact values.
struct Reference {
  double loss = 0;
  double z_abs = 0;  // the largest sum of the magnitudes of a logit's terms
  std::vector<double> dx, dw, dbias, dx_abs, dw_abs;
};

std::vector<double> logits64(const Problem& p, int64_t i) {
  const int64_t d = p.x.dim(1), v = p.w.dim(1);
  const std::vector<double> x = testing::to_doubles(p.x), w = testing::to_doubles(p.w), b = testing::to_doubles(p.bias);
  std::vector<double> z(b.begin(), b.end());
  for (int64_t j = 0; j < v; ++j)
    for (int64_t k = 0; k < d; ++k) z[static_cast<size_t>(j)] += x[static_cast<size_t>(i * d + k)] * w[static_cast<size_t>(k * v + j)];
  return z;
}

double loss64(const Problem& p) {
  const std::vector<int64_t> l = p.labels.to_int64s();
  double total = 0;
  for (int64_t i = 0; i < p.x.dim(0); ++i) {
    const std::vector<double> z = logits64(p, i);
    const double mx = *std::max_element(z.begin(), z.end());
    double s = 0;
    for (double zj : z) s += std::exp(zj - mx);
    total += mx + std::log(s) - z[static_cast<size_t>(l[static_cast<size_t>(i)])];
  }
  return total / static_cast<double>(p.x.dim(0));
}

Reference reference(const Problem& p, double seed) {
  const int64_t n = p.x.dim(0), d = p.x.dim(1), v = p.w.dim(1);
  const std::vector<double> x = testing::to_doubles(p.x), w = testing::to_doubles(p.w);
  const std::vector<int64_t> l = p.labels.to_int64s();
  Reference r;
  r.loss = loss64(p);
  r.dx.assign(static_cast<size_t>(n * d), 0);
  r.dx_abs = r.dx;
  r.dw.assign(static_cast<size_t>(d * v), 0);
  r.dw_abs = r.dw;
  r.dbias.assign(static_cast<size_t>(v), 0);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> z = logits64(p, i);
    const double mx = *std::max_element(z.begin(), z.end());
    double s = 0;
    for (double zj : z) s += std::exp(zj - mx);
    for (int64_t j = 0; j < v; ++j) {
      const size_t js = static_cast<size_t>(j);
      double terms = 1;  // |bias| <= 1
      for (int64_t k = 0; k < d; ++k) terms += std::abs(x[static_cast<size_t>(i * d + k)] * w[static_cast<size_t>(k * v + j)]);
      r.z_abs = std::max(r.z_abs, terms);
      const double g = seed / static_cast<double>(n) * (std::exp(z[js] - mx) / s - (l[static_cast<size_t>(i)] == j));
      r.dbias[js] += g;
      for (int64_t k = 0; k < d; ++k) {
        const size_t xi = static_cast<size_t>(i * d + k), wi = static_cast<size_t>(k * v + j);
        r.dx[xi] += g * w[wi];
        r.dx_abs[xi] += std::abs(g * w[wi]);
        r.dw[wi] += g * x[xi];
        r.dw_abs[wi] += std::abs(g * x[xi]);
      }
    }
  }
  return r;
}

// Error bound of a gradient element. Each logit's float32 dot product errs by at most (d + 2) float32 units of the
// sum of its terms' magnitudes (z_abs: the largest such sum), which the softmax turns into the same absolute error
// of log p, i.e. a relative error of each dlogit; the float32 exp and the sum over v classes add a few units each;
// rounding the dlogit into the operands' dtype adds unit(dt) relative, or half a subnormal step absolute (float16's
// small dlogits are subnormal). The products are exact in float32 and their sum over `depth` terms adds depth units;
// the result is rounded once into its dtype.
struct Bound {
  DType dt;
  double z_abs;        // the largest sum of a logit's terms' magnitudes
  int64_t d, v, depth;  // the features, the classes, the terms of this gradient's sum
  double operand_max;   // the largest magnitude of the other factor of its terms (|x| or |w|)
  double operator()(double abs_sum, double value) const {
    const double f32 = 0x1p-24;
    const double relative = 2 * static_cast<double>(d + 2) * f32 * z_abs + static_cast<double>(2 * v + 8) * f32 +
                            unit(dt) + static_cast<double>(depth) * f32;
    const double subnormal = testing::subnormal_step(dt) * (static_cast<double>(depth) * operand_max + 1);
    return relative * abs_sum + unit(dt) * std::abs(value) + subnormal;
  }
};

void expect_close(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& abs_sum,
                  const Bound& bound, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], bound(abs_sum[i], want[i])) << what << " [" << i << "] " << dtype_name(bound.dt);
}

TEST(LinearCrossEntropy, MatchesAFloat64ReferenceInEveryDtypeAndChunking) {
  for (DType dt : testing::kFloatDTypes)
    for (int64_t n : {1, 17, 129})
      for (int64_t chunk : {1, 7, 0}) {
        const int64_t d = 31, v = 67;
        const Problem p = make_problem(n, d, v, dt, static_cast<uint64_t>(n * 10 + chunk));
        const double seed = dt == DType::kFloat16 ? 1024.0 : 1.0;  // a loss scale under float16
        const LinearCrossEntropy got = linear_cross_entropy(p.x, p.w, p.bias, p.labels,
                                                            Tensor::from_floats({1}, {static_cast<float>(seed)}), chunk);
        const Reference want = reference(p, seed);
        // The loss: float32 logits (relative error ~ d float32 units of their terms, |x w| <= 2 d) and a float32
        // log-sum-exp per row; summed in double.
        EXPECT_NEAR(got.loss.item(), want.loss, 1e-5 * (1 + want.loss)) << dtype_name(dt) << " n" << n;
        expect_close(got.dx.to_floats(), want.dx, want.dx_abs, Bound{dt, want.z_abs, d, v, v, 1.0}, "dx");
        expect_close(got.dw.to_floats(), want.dw, want.dw_abs, Bound{dt, want.z_abs, d, v, n, 2.0}, "dw");
        // dbias sums the float32 dlogits (never rounded into dt): each within the relative bound of seed / n.
        std::vector<double> db_abs(want.dbias.size(), seed);
        expect_close(got.dbias.to_floats(), want.dbias, db_abs, Bound{DType::kFloat32, want.z_abs, d, v, n, 0.0},
                     "dbias");
      }
}

TEST(LinearCrossEntropy, EqualsTheUnfusedProjectionAndLoss) {
  const Problem p = make_problem(300, 40, 129, DType::kFloat32, 5);
  const Tensor seed = Tensor::from_floats({1}, {8.0f});
  const LinearCrossEntropy fused = linear_cross_entropy(p.x, p.w, p.bias, p.labels, seed, 64);
  const Tensor logits = linear(p.x, p.w, p.bias);
  const Tensor dlogits = sparse_categorical_crossentropy_backward(logits, p.labels, true, seed);
  const LinearGrads g = linear_backward(dlogits, p.x, p.w, true, true);
  EXPECT_NEAR(fused.loss.item(), sparse_categorical_crossentropy(logits, p.labels, true).item(), 1e-6);
  EXPECT_EQ(fused.correct.item(), count_correct(logits, p.labels).item());
  const auto close = [](const Tensor& a, const Tensor& b, double tol, const char* what) {
    const std::vector<float> x = a.to_floats(), y = b.to_floats();
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], y[i], tol) << what << " [" << i << "]";
  };
  // Gradients of size ~ seed / 300 * |w| summed over 129 or 300 terms: float32 rounding of sums in another order.
  close(fused.dx, g.dx, 1e-6, "dx");
  close(fused.dw, g.dw, 1e-6, "dw");
  close(fused.dbias, g.dbias, 1e-6, "dbias");
}

TEST(LinearCrossEntropy, GradientsMatchFiniteDifferencesOfTheFloat64Loss) {
  Problem p = make_problem(13, 9, 23, DType::kFloat32, 17);
  const LinearCrossEntropy got =
      linear_cross_entropy(p.x, p.w, p.bias, p.labels, Tensor::from_floats({1}, {1.0f}), 5);
  // Central differences of the float64 loss, moving one float32 input by h: truncation O(h^2), and the inputs stay
  // exact (the reference reads the perturbed float32 values, h a power of two well above their spacing).
  const double h = 0x1p-10;
  const auto check = [&](Tensor& t, const Tensor& grad, const char* what) {
    std::vector<float> v = t.to_floats();
    const std::vector<float> gv = grad.to_floats();
    for (size_t i = 0; i < v.size(); i += 3) {
      const float keep = v[i];
      v[i] = keep + static_cast<float>(h);
      t = Tensor::from_floats(t.shape(), v);
      const double up = loss64(p);
      v[i] = keep - static_cast<float>(h);
      t = Tensor::from_floats(t.shape(), v);
      const double down = loss64(p);
      v[i] = keep;
      t = Tensor::from_floats(t.shape(), v);
      EXPECT_NEAR(gv[i], (up - down) / (2 * h), 2e-6) << what << " [" << i << "]";
    }
  };
  check(p.x, got.dx, "dx");
  check(p.w, got.dw, "dw");
  check(p.bias, got.dbias, "dbias");
}

TEST(LinearCrossEntropy, ResultsDoNotDependOnTheThreadCount) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const Problem p = make_problem(203, 48, 300, dt, 3);
    const int saved = omp_get_max_threads();
    std::vector<std::vector<float>> results;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      const LinearCrossEntropy r =
          linear_cross_entropy(p.x, p.w, p.bias, p.labels, Tensor::from_floats({1}, {1.0f}), 50);
      std::vector<float> all;
      for (const Tensor& t : {r.loss, r.correct, r.dx, r.dw, r.dbias}) {
        const std::vector<float> f = t.to_floats();
        all.insert(all.end(), f.begin(), f.end());
      }
      results.push_back(all);
    }
    omp_set_num_threads(saved);
    for (size_t i = 1; i < results.size(); ++i)
      EXPECT_EQ(0, std::memcmp(results[0].data(), results[i].data(), results[0].size() * sizeof(float)))
          << dtype_name(dt);
  }
}

TEST(LinearCrossEntropy, WithoutASeedGivesTheLossAndCountOnlyAndNoBias) {
  const Problem p = make_problem(40, 8, 11, DType::kBFloat16, 9);
  const LinearCrossEntropy r = linear_cross_entropy(p.x, p.w, Tensor(), p.labels);
  EXPECT_FALSE(r.dx.defined());
  EXPECT_FALSE(r.dw.defined());
  Problem no_bias = p;
  no_bias.bias = Tensor::from_floats({11}, std::vector<float>(11, 0.0f));
  EXPECT_NEAR(r.loss.item(), reference(no_bias, 1.0).loss, 1e-5);
  const Tensor logits = linear(p.x.to(DType::kFloat32), p.w.to(DType::kFloat32), Tensor());
  EXPECT_EQ(r.correct.item(), count_correct(logits, p.labels).item());
}

TEST(LinearCrossEntropy, NeverHoldsTheWholeLogits) {
  const Problem p = make_problem(4096, 16, 2048, DType::kFloat32, 4);  // the logits alone: 32 MiB
  const Tensor seed = Tensor::from_floats({1}, {1.0f});
  reset_peak_memory();
  const int64_t before = memory_stats().live_bytes;
  { const LinearCrossEntropy r = linear_cross_entropy(p.x, p.w, p.bias, p.labels, seed, 512); }
  const int64_t extra = memory_stats().peak_bytes - before;
  // Outputs dx (256 KiB), dw and dbias (about 128 KiB), one chunk of logits (4 MiB): far below 32 MiB.
  EXPECT_LT(extra, 6 << 20);
  EXPECT_GT(extra, 4 << 20);  // the chunk buffer is counted: the measure can fail
}

TEST(LinearCrossEntropy, RefusesBadOperandsWithOneClearLine) {
  const Problem p = make_problem(4, 3, 5, DType::kFloat32, 2);
  EXPECT_THROW(linear_cross_entropy(p.x, p.w, p.bias, Tensor::from_ints({4}, {0, 1, 5, 2})), Error);
  EXPECT_THROW(linear_cross_entropy(p.x, p.w.to(DType::kBFloat16), p.bias, p.labels), Error);
  EXPECT_THROW(linear_cross_entropy(p.x, p.w, Tensor::from_floats({4}, {0, 0, 0, 0}), p.labels), Error);
  EXPECT_THROW(linear_cross_entropy(p.x, p.w, p.bias, p.labels, Tensor(), -1), Error);
}

}  // namespace
}  // namespace mixtrain::ops
