// matmul, bmm and linear against float64 references, in every floating dtype, on odd shapes, batch
// shapes that broadcast, and strided views; bmm_backward against float64 finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "mixtrain/ops/matmul.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::random_tensor;
using testing::to_doubles;
using testing::unit;

// The float64 product of values as stored; mag gets sum |a b| per element (the scale of float32 sum error).
struct Ref {
  std::vector<int64_t> shape;
  std::vector<double> c, mag;
  int64_t k = 0;
};

Ref bmm_ref(const std::vector<double>& av, const Shape& as, const std::vector<double>& bv, const Shape& bs, bool ta,
            bool tb) {
  const int ra = as.rank(), rb = bs.rank();
  const int64_t a_rows = as[-2], a_cols = as[-1], b_rows = bs[-2], b_cols = bs[-1];
  const int64_t m = ta ? a_cols : a_rows, k = ta ? a_rows : a_cols, n = tb ? b_rows : b_cols;
  const int br = std::max(ra, rb) - 2;
  std::vector<int64_t> batch(static_cast<size_t>(br));
  for (int d = 0; d < br; ++d) {
    const int da = d - (br - (ra - 2)), db = d - (br - (rb - 2));
    batch[d] = std::max(da >= 0 ? as[da] : 1, db >= 0 ? bs[db] : 1);
  }
  int64_t count = 1;
  for (int64_t x : batch) count *= x;
  Ref r;
  r.k = k;
  r.shape = batch;
  r.shape.push_back(m);
  r.shape.push_back(n);
  r.c.assign(static_cast<size_t>(count * m * n), 0.0);
  r.mag = r.c;
  for (int64_t p = 0; p < count; ++p) {
    // Flat batch indices of a and b, with broadcast dimensions read at 0.
    int64_t rest = p, ia = 0, ib = 0, sa = 1, sb = 1;
    for (int d = br - 1; d >= 0; --d) {
      const int64_t idx = rest % batch[d];
      rest /= batch[d];
      const int da = d - (br - (ra - 2)), db = d - (br - (rb - 2));
      if (da >= 0) {
        ia += (as[da] == 1 ? 0 : idx) * sa;
        sa *= as[da];
      }
      if (db >= 0) {
        ib += (bs[db] == 1 ? 0 : idx) * sb;
        sb *= bs[db];
      }
    }
    const double* A = av.data() + ia * a_rows * a_cols;
    const double* B = bv.data() + ib * b_rows * b_cols;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0, g = 0;
        for (int64_t q = 0; q < k; ++q) {
          const double x = ta ? A[q * a_cols + i] : A[i * a_cols + q];
          const double y = tb ? B[j * b_cols + q] : B[q * b_cols + j];
          s += x * y;
          g += std::fabs(x * y);
        }
        r.c[static_cast<size_t>((p * m + i) * n + j)] = s;
        r.mag[static_cast<size_t>((p * m + i) * n + j)] = g;
      }
  }
  return r;
}

// Error bound of one product element, the contract of kernels::gemm: float32 accumulation (k units of
// 2^-24 of sum |ab|) and one rounding into d.
double product_tolerance(DType d, int64_t k, double c, double mag) {
  return k * 0x1p-24 * mag + unit(d) * std::fabs(c);
}

// Checks bmm(a, b, ta, tb) in out dtype d against float64: float32 accumulation (k * 2^-24 * sum |ab|)
// plus one rounding into d (product_tolerance).
void check_bmm(const Tensor& a, const Tensor& b, bool ta, bool tb, const std::string& what) {
  const DType d = a.dtype();
  Tensor c = bmm(a, b, ta, tb);
  const Ref r = bmm_ref(to_doubles(a), a.shape(), to_doubles(b), b.shape(), ta, tb);
  ASSERT_EQ(c.shape(), Shape(r.shape)) << what;
  EXPECT_EQ(c.dtype(), d);
  const std::vector<double> cv = to_doubles(c);
  for (size_t i = 0; i < cv.size(); ++i)
    ASSERT_NEAR(cv[i], r.c[i], product_tolerance(d, r.k, r.c[i], r.mag[i]) + 1e-7)
        << what << " " << dtype_name(d) << " element " << i;
}

Shape matrix_shape(std::vector<int64_t> batch, int64_t rows, int64_t cols, bool trans) {
  batch.push_back(trans ? cols : rows);
  batch.push_back(trans ? rows : cols);
  return Shape(batch);
}

TEST(Bmm, MatchesFloat64OnOddAndBroadcastBatchShapes) {
  struct Case {
    std::vector<int64_t> batch_a, batch_b;
    int64_t m, k, n;
  };
  const Case cases[] = {
      {{}, {}, 1, 1, 1},          {{}, {}, 7, 17, 31},        {{5}, {5}, 7, 17, 31},  {{}, {4}, 7, 17, 129},
      {{2, 1}, {3}, 7, 31, 1},    {{1}, {3}, 17, 7, 17},      {{3, 1, 2}, {1, 5, 1}, 7, 1, 7},
      {{129}, {129}, 1, 7, 7},    {{2}, {}, 129, 17, 7},
  };
  for (DType d : kFloatDTypes)
    for (const Case& c : cases)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          Tensor a = random_tensor(matrix_shape(c.batch_a, c.m, c.k, ta), 1 + c.m, d);
          Tensor b = random_tensor(matrix_shape(c.batch_b, c.k, c.n, tb), 2 + c.n, d);
          check_bmm(a, b, ta, tb, a.describe() + " x " + b.describe() + (ta ? " ta" : "") + (tb ? " tb" : ""));
        }
}

TEST(Bmm, ReadsViewsInPlaceOrThroughACopy) {
  for (DType d : kFloatDTypes) {
    // A transpose view of the last two dimensions: read in place with the trans flag flipped.
    Tensor at = random_tensor({5, 17, 7}, 3, d).transpose(-2, -1);  // (5, 7, 17)
    // Batch dimension outermost in memory last: permuted batch stride, in place.
    Tensor bp = random_tensor({17, 5, 31}, 4, d).permute({1, 0, 2});  // (5, 17, 31)
    // Columns sliced out of wider rows: row stride 40, in place.
    Tensor bs = random_tensor({5, 17, 40}, 5, d).slice(2, 3, 34);  // (5, 17, 31)
    // Neither dimension unit-strided: copied first.
    Tensor ac = random_tensor({7, 17, 5}, 6, d).permute({2, 0, 1});  // (5, 7, 17)
    // A sliced batch.
    Tensor as = random_tensor({9, 7, 17}, 7, d).slice(0, 2, 7);  // (5, 7, 17)
    for (const Tensor* a : {&at, &ac, &as})
      for (const Tensor* b : {&bp, &bs}) {
        ASSERT_FALSE(b->is_contiguous());
        check_bmm(*a, *b, false, false, "views " + a->describe() + " x " + b->describe());
        // trans flags on top of a transposed view.
        check_bmm(a->transpose(-2, -1), b->transpose(-2, -1), true, true, "transposed views");
      }
  }
}

TEST(Bmm, ManySmallProductsSplitAcrossThreadsGiveTheSameBits) {
  // 300 products of (7, 17) x (17, 7) run across the batch; each equals its product computed alone.
  Tensor a = random_tensor({300, 7, 17}, 8, DType::kBFloat16), b = random_tensor({300, 17, 7}, 9, DType::kBFloat16);
  Tensor c = bmm(a, b, false, false, DType::kFloat32);
  for (int64_t p : {0, 1, 150, 299}) {
    Tensor one = bmm(a.slice(0, p, p + 1), b.slice(0, p, p + 1), false, false, DType::kFloat32);
    EXPECT_EQ(c.slice(0, p, p + 1).to_floats(), one.to_floats()) << p;
  }
}

TEST(Bmm, RejectsShapesThatDoNotFit) {
  Tensor a = Tensor::zeros({2, 3, 4}, DType::kFloat32);
  EXPECT_THROW(bmm(a, Tensor::zeros({3, 4, 5}, DType::kFloat32)), Error);  // batch 2 vs 3
  EXPECT_THROW(bmm(a, Tensor::zeros({2, 5, 4}, DType::kFloat32)), Error);  // inner 4 vs 5
  EXPECT_THROW(bmm(a, Tensor::zeros({4}, DType::kFloat32)), Error);        // rank 1
  EXPECT_THROW(bmm(a, Tensor::zeros({2, 4, 5}, DType::kFloat16)), Error);  // dtypes differ
  EXPECT_EQ(bmm(a, Tensor::zeros({2, 4, 0}, DType::kFloat32)).shape(), Shape({2, 3, 0}));
}

// Gradients of L = sum(bmm(a, b) * r) by central differences of the float64 product. The product is
// bilinear, so the differences are exact up to float64 rounding; mag bounds the float32 sum error.
std::vector<double> fd_grad(std::vector<double> av, const Shape& as, std::vector<double> bv, const Shape& bs, bool ta,
                            bool tb, const std::vector<double>& r, bool wrt_a) {
  std::vector<double>& x = wrt_a ? av : bv;
  std::vector<double> g(x.size());
  const double h = 0.5;
  auto loss = [&] {
    const Ref c = bmm_ref(av, as, bv, bs, ta, tb);
    double s = 0;
    for (size_t i = 0; i < c.c.size(); ++i) s += c.c[i] * r[i];
    return s;
  };
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = loss();
    x[i] = keep - h;
    const double down = loss();
    x[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

std::vector<double> absolute(std::vector<double> v) {
  for (double& x : v) x = std::fabs(x);
  return v;
}

TEST(Bmm, BackwardMatchesFiniteDifferencesIncludingBroadcastOperands) {
  struct Case {
    std::vector<int64_t> batch_a, batch_b;
    int64_t m, k, n;
  };
  const Case cases[] = {{{}, {}, 7, 5, 3}, {{3}, {3}, 1, 7, 5}, {{2, 1}, {3}, 3, 5, 7}, {{}, {2, 3}, 5, 3, 1}};
  for (DType d : kFloatDTypes)
    for (const Case& c : cases)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          Tensor a = random_tensor(matrix_shape(c.batch_a, c.m, c.k, ta), 10 + c.m, d);
          Tensor b = random_tensor(matrix_shape(c.batch_b, c.k, c.n, tb), 11 + c.n, d);
          Tensor out = bmm(a, b, ta, tb);
          Tensor dc = random_tensor(out.shape(), 12, d);
          const std::vector<double> av = to_doubles(a), bv = to_doubles(b), r = to_doubles(dc);
          BmmGrads g = bmm_backward(dc, a, b, ta, tb, true, true);
          ASSERT_EQ(g.da.shape(), a.shape());
          ASSERT_EQ(g.db.shape(), b.shape());
          EXPECT_EQ(g.da.dtype(), d);
          EXPECT_EQ(g.db.dtype(), d);
          for (bool wrt_a : {true, false}) {
            const std::vector<double> want = fd_grad(av, a.shape(), bv, b.shape(), ta, tb, r, wrt_a);
            const std::vector<double> mag =
                fd_grad(absolute(av), a.shape(), absolute(bv), b.shape(), ta, tb, absolute(r), wrt_a);
            const std::vector<double> got = to_doubles(wrt_a ? g.da : g.db);
            // Sums over k or the batch and m (or n) in float32, then one rounding into d.
            const int64_t terms = std::max<int64_t>(c.n, c.m) * 6;
            for (size_t i = 0; i < got.size(); ++i)
              ASSERT_NEAR(got[i], want[i], product_tolerance(d, terms, want[i], mag[i]) + 1e-9)
                  << (wrt_a ? "da " : "db ") << a.describe() << " x " << b.describe() << (ta ? " ta" : "")
                  << (tb ? " tb" : "") << " element " << i;
          }
          // need_* flags skip work.
          BmmGrads only_b = bmm_backward(dc, a, b, ta, tb, false, true);
          EXPECT_FALSE(only_b.da.defined());
          EXPECT_TRUE(only_b.db.defined());
        }
}

TEST(Matmul, ShapeErrorsNameBothOperands) {
  Tensor a = Tensor::zeros({2, 3}, DType::kFloat32), b = Tensor::zeros({4, 5}, DType::kFloat32);
  try {
    matmul(a, b);
    FAIL() << "matmul accepted (2, 3) x (4, 5)";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("float32 (2, 3) x float32 (4, 5)"), std::string::npos) << e.what();
  }
}

TEST(Matmul, NDimensionalInputsAreBatchedProducts) {
  Tensor a = random_tensor({2, 3, 7, 17}, 13, DType::kFloat16), b = random_tensor({17, 31}, 14, DType::kFloat16);
  EXPECT_EQ(matmul(a, b).to_floats(), bmm(a, b).to_floats());
  EXPECT_EQ(matmul(a, b).shape(), Shape({2, 3, 7, 31}));
  MatmulGrads g = matmul_backward(random_tensor({2, 3, 7, 31}, 15, DType::kFloat16), a, b, false, false, true, true);
  EXPECT_EQ(g.da.shape(), a.shape());
  EXPECT_EQ(g.db.shape(), b.shape());
}

TEST(Linear, FloatSixteenForwardAndFloat32KernelGradient) {
  for (DType d : kFloatDTypes) {
    const int64_t b = 17, in = 31, out = 7;
    Tensor x = random_tensor({b, in}, 4, d), w = random_tensor({in, out}, 5, d), bias = random_tensor({out}, 6, DType::kFloat32);
    const std::vector<float> xv = x.to_floats(), wv = w.to_floats(), bv = bias.to_floats();
    Tensor y = linear(x, w, bias);
    EXPECT_EQ(y.dtype(), d);
    const std::vector<float> yv = y.to_floats();
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < out; ++j) {
        double s = bv[j], sabs = std::fabs(bv[j]);
        for (int64_t k = 0; k < in; ++k) {
          s += static_cast<double>(xv[i * in + k]) * wv[k * out + j];
          sabs += std::fabs(static_cast<double>(xv[i * in + k]) * wv[k * out + j]);
        }
        // float32 accumulation (in * 2^-24 * sum|xw|) plus one rounding into d.
        EXPECT_NEAR(yv[i * out + j], s, in * 0x1p-24 * sabs + unit(d) * std::fabs(s) + 1e-7) << dtype_name(d);
      }
    Tensor dy = random_tensor({b, out}, 7, d);
    LinearGrads g = linear_backward(dy, x, w, true, true);
    EXPECT_EQ(g.dw.dtype(), DType::kFloat32);
    EXPECT_EQ(g.dx.dtype(), d);
    const std::vector<float> dyv = dy.to_floats(), dwv = g.dw.to_floats(), dbv = g.dbias.to_floats();
    for (int64_t k = 0; k < in; ++k)
      for (int64_t j = 0; j < out; ++j) {
        double s = 0, sabs = 0;
        for (int64_t i = 0; i < b; ++i) {
          s += static_cast<double>(xv[i * in + k]) * dyv[i * out + j];
          sabs += std::fabs(static_cast<double>(xv[i * in + k]) * dyv[i * out + j]);
        }
        EXPECT_NEAR(dwv[k * out + j], s, b * 0x1p-24 * sabs + 1e-7);  // no 16-bit rounding of dW
      }
    for (int64_t j = 0; j < out; ++j) {
      double s = 0;
      for (int64_t i = 0; i < b; ++i) s += dyv[i * out + j];
      EXPECT_NEAR(dbv[j], s, 1e-5);
    }
  }
}

TEST(Linear, FlattensLeadingDimensions) {
  for (DType d : kFloatDTypes) {
    Tensor x = random_tensor({2, 3, 17}, 16, d), w = random_tensor({17, 7}, 17, d);
    Tensor bias = random_tensor({7}, 18, DType::kFloat32);
    Tensor y = linear(x, w, bias);
    ASSERT_EQ(y.shape(), Shape({2, 3, 7}));
    EXPECT_EQ(y.to_floats(), linear(x.reshape({6, 17}), w, bias).to_floats());
    // A view input (its leading dimensions permuted) gives the same rows.
    Tensor xv = random_tensor({3, 2, 17}, 19, d).transpose(0, 1);
    EXPECT_EQ(linear(xv, w, Tensor()).to_floats(), linear(xv.contiguous(), w, Tensor()).to_floats());
    Tensor dy = random_tensor({2, 3, 7}, 20, d);
    LinearGrads g = linear_backward(dy, x, w, true, true);
    LinearGrads g2 = linear_backward(dy.reshape({6, 7}), x.reshape({6, 17}), w, true, true);
    EXPECT_EQ(g.dx.shape(), x.shape());
    EXPECT_EQ(g.dx.to_floats(), g2.dx.to_floats());
    EXPECT_EQ(g.dw.to_floats(), g2.dw.to_floats());
    EXPECT_EQ(g.dbias.to_floats(), g2.dbias.to_floats());
  }
  EXPECT_THROW(linear(Tensor::zeros({2, 3}, DType::kFloat32), Tensor::zeros({4, 2}, DType::kFloat32), Tensor()), Error);
}

}  // namespace
}  // namespace mixtrain::ops
