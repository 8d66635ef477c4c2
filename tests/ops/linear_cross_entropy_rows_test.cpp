// The GPU linear_cross_entropy's row and column steps (src/ops/shared/linear_cross_entropy_row.h) driven on the host
// as its kernels drive them (cuda/linear_cross_entropy.cu: per chunk, the logits' GEMM, one row function per row,
// the dlogits rounded into the operands' dtype, the dx and dw GEMMs, one column sum per dbias element), on any
// machine, against the CPU kernel (ops::linear_cross_entropy) and a float64 loss. The driver's GEMMs stand in for
// cuBLASLt's: float64 sums rounded once to float32 (then into the output's dtype), products of the same operands.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "mixtrain/core/random.h"
#include "mixtrain/ops/linear_cross_entropy.h"
#include "linear_cross_entropy_problem.h"
#include "op_test_util.h"
#include "ops/shared/float16_convert.h"
#include "ops/shared/linear_cross_entropy_row.h"

namespace mixtrain::ops {
namespace {

using testing::random_tensor;
using testing::unit;

using Problem = testing::LinearCrossEntropyProblem;
Problem make_problem(int64_t n, int64_t d, int64_t v, DType dt, uint64_t seed) {
  return testing::make_linear_cross_entropy_problem(n, d, v, dt, seed, seed + 3);
}

struct Driven {
  float loss = 0, correct = 0;
  std::vector<float> dx, dw, dbias;  // dx already rounded into x's dtype (and widened back)
};

// The GPU's plan on the host, chunk by chunk.
Driven drive(const Problem& p, float seed, int64_t chunk) {
  const int64_t n = p.x.dim(0), d = p.x.dim(1), v = p.w.dim(1);
  const int code = shared::float_code(p.x.dtype());
  const std::vector<float> x = p.x.to_floats(), w = p.w.to_floats(), b = p.bias.to_floats();
  const std::vector<int64_t> labels = p.labels.to_int64s();
  const float k = shared::linear_cross_entropy_grad_scale(seed, n);
  Driven r;
  r.dx.assign(static_cast<size_t>(n * d), 0.0f);
  r.dw.assign(static_cast<size_t>(d * v), 0.0f);
  r.dbias.assign(static_cast<size_t>(v), 0.0f);
  std::vector<double> row_loss(static_cast<size_t>(n));
  int64_t hits = 0;
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t c = std::min(chunk, n - r0);
    std::vector<float> z(static_cast<size_t>(c * v)), g(static_cast<size_t>(c * v));
    for (int64_t i = 0; i < c; ++i)
      for (int64_t j = 0; j < v; ++j) {
        double s = 0;
        for (int64_t t = 0; t < d; ++t) s += double{x[static_cast<size_t>((r0 + i) * d + t)]} * w[static_cast<size_t>(t * v + j)];
        z[static_cast<size_t>(i * v + j)] = shared::add_rn(static_cast<float>(s), b[static_cast<size_t>(j)]);
      }
    for (int64_t i = 0; i < c; ++i) {
      const shared::LinearCrossEntropyRow row = shared::linear_cross_entropy_row(
          z.data() + i * v, v, labels[static_cast<size_t>(r0 + i)], true, k);
      row_loss[static_cast<size_t>(r0 + i)] = row.loss;
      hits += row.correct;
    }
    for (size_t e = 0; e < z.size(); ++e) g[e] = shared::through_dtype(z[e], code);  // the GEMMs' operand
    for (int64_t i = 0; i < c; ++i)
      for (int64_t t = 0; t < d; ++t) {
        double s = 0;
        for (int64_t j = 0; j < v; ++j) s += double{g[static_cast<size_t>(i * v + j)]} * w[static_cast<size_t>(t * v + j)];
        r.dx[static_cast<size_t>((r0 + i) * d + t)] = shared::through_dtype(static_cast<float>(s), code);
      }
    for (int64_t t = 0; t < d; ++t)
      for (int64_t j = 0; j < v; ++j) {
        double s = 0;
        for (int64_t i = 0; i < c; ++i) s += double{x[static_cast<size_t>((r0 + i) * d + t)]} * g[static_cast<size_t>(i * v + j)];
        float& dw = r.dw[static_cast<size_t>(t * v + j)];
        dw = r0 == 0 ? static_cast<float>(s) : shared::add_rn(dw, static_cast<float>(s));
      }
    for (int64_t j = 0; j < v; ++j)
      r.dbias[static_cast<size_t>(j)] =
          shared::linear_cross_entropy_bias_grad(z.data(), c, v, j, r0 == 0 ? 0.0f : r.dbias[static_cast<size_t>(j)]);
  }
  double total = 0;
  for (double l : row_loss) total += l;
  r.loss = static_cast<float>(n ? total / static_cast<double>(n) : 0.0);
  r.correct = static_cast<float>(hits);
  return r;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

// |got - want| <= rel * |want| + abs_tol for every element.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel, double abs_tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], rel * std::fabs(want[i]) + abs_tol) << what << " element " << i;
}

// Tolerances: the two sides' logits differ by float32 rounding of sums in other orders (and the rows' exponential
// is the polynomial where the CPU takes std::exp: a few float32 units), so the loss agrees to 1e-5 relative. A
// dlogit differs by a few float32 units; rounded into a 16-bit dtype it may land one unit of that dtype apart, which
// moves dx and dw by up to unit(dt) of their terms' magnitudes: bounded by 4 unit(dt) of the tensor's largest
// element, or 1e-5 of it for float32. dbias sums the float32 dlogits on both sides: 1e-5 of its largest element.
TEST(LinearCrossEntropyRows, HostDrivenKernelsMatchTheCpuKernel) {
  for (DType dt : testing::kFloatDTypes)
    for (int64_t n : {1, 7, 17, 129})
      for (int64_t chunk : {1, 16, 4096}) {
        const int64_t d = 24, v = 67;
        const Problem p = make_problem(n, d, v, dt, static_cast<uint64_t>(n * 100 + chunk));
        const float seed = dt == DType::kFloat16 ? 1024.0f : 1.0f;
        const std::string what = std::string(dtype_name(dt)) + " n" + std::to_string(n) + " chunk" + std::to_string(chunk);
        const Driven got = drive(p, seed, chunk);
        const LinearCrossEntropy want =
            linear_cross_entropy(p.x, p.w, p.bias, p.labels, Tensor::from_floats({1}, {seed}), chunk);
        EXPECT_NEAR(got.loss, want.loss.item(), 1e-5 * (1 + std::fabs(want.loss.item()))) << what;
        const std::vector<float> dx = want.dx.to_floats(), dw = want.dw.to_floats(), db = want.dbias.to_floats();
        const double rel = dt == DType::kFloat32 ? 1e-5 : 4 * unit(dt);
        expect_close(got.dx, dx, unit(dt), rel * max_abs(dx) + testing::subnormal_step(dt), what + " dx");
        expect_close(got.dw, dw, 1e-5, rel * max_abs(dw), what + " dw");
        expect_close(got.dbias, db, 1e-5, 1e-5 * max_abs(db), what + " dbias");
      }
}

// The arg-max count is exact: the rows take the first maximum as the CPU kernel does, on logits built so that
// every row has ties (integers) and the label sits on the first maximum in every other row.
TEST(LinearCrossEntropyRows, CountsTheRowsWhoseFirstMaximumIsTheLabel) {
  const int64_t n = 17, v = 9;
  int64_t want = 0;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float> z(static_cast<size_t>(v));
    for (int64_t j = 0; j < v; ++j) z[static_cast<size_t>(j)] = static_cast<float>((i + j * 3) % 4);
    const int64_t first_max = std::max_element(z.begin(), z.end()) - z.begin();
    const int64_t last_max = v - 1 - (std::max_element(z.rbegin(), z.rend()) - z.rbegin());
    const int64_t label = i % 2 == 0 ? first_max : last_max;
    want += label == first_max;
    const shared::LinearCrossEntropyRow r = shared::linear_cross_entropy_row(z.data(), v, label, false, 0.0f);
    EXPECT_EQ(r.correct, label == first_max) << "row " << i;
    // -log softmax(z)[label] in float64 from the same integers.
    double s = 0;
    for (float zj : z) s += std::exp(static_cast<double>(zj) - 3.0);
    EXPECT_NEAR(r.loss, 3.0 + std::log(s) - z[static_cast<size_t>(label)], 1e-6) << "row " << i;
  }
  EXPECT_GT(want, 0);
  EXPECT_LT(want, n);
}

}  // namespace
}  // namespace mixtrain::ops
