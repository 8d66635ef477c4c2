// The rotary embedding against a float64 reference (rotate-half pairs, angles from the definition) in every floating
// dtype on odd shapes, with offsets; the backward against float64 finite differences; offsets agree with slices (what
// cached generation needs); the columns past rotated_width are copied; views; bad options refused.
#include <gtest/gtest.h>

#include <cmath>

#include "mixtrain/ops/rotary_embedding.h"

#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::random_tensor;
using testing::unit;

struct Case {
  Shape shape;
  RotaryOptions o;
};

const Case kCases[] = {
    {{1, 1, 2}, {2, 2, 0, 10000.0}},      {{2, 7, 31}, {10, 20, 0, 10000.0}}, {{1, 17, 34}, {2, 34, 5, 10000.0}},
    {{3, 129, 8}, {8, 8, 0, 10000.0}},    {{1, 31, 48}, {16, 32, 1000, 500.0}},
};

// The float64 rotation of x (batch, T, C) as a flat vector, from the definition in ops/rotary_embedding.h; `sign` -1
// turns back.
std::vector<double> reference(const std::vector<double>& x, const Shape& shape, const RotaryOptions& o, double sign) {
  const int64_t t_len = shape[1], c = shape[2], half = o.head_dim / 2;
  std::vector<double> y(x);
  for (int64_t r = 0; r < shape.numel() / c; ++r)
    for (int64_t h0 = 0; h0 < o.rotated_width; h0 += o.head_dim)
      for (int64_t i = 0; i < half; ++i) {
        const double angle = sign * static_cast<double>(o.offset + r % t_len) *
                             std::pow(o.base, -2.0 * static_cast<double>(i) / static_cast<double>(o.head_dim));
        const double a = x[r * c + h0 + i], b = x[r * c + h0 + half + i];
        y[r * c + h0 + i] = a * std::cos(angle) - b * std::sin(angle);
        y[r * c + h0 + half + i] = b * std::cos(angle) + a * std::sin(angle);
      }
  return y;
}

// Each element within its final rounding (unit(dt) relative) plus the float32 tables' and products' errors (a few
// 2^-24 of the pair's size, |a| + |b| bounding both terms).
void expect_near_reference(const Tensor& got, const std::vector<double>& x, const std::vector<double>& want,
                           const Shape& shape, const RotaryOptions& o, DType dt, const std::string& what) {
  const std::vector<float> g = got.to_floats();
  const int64_t c = shape[2], half = o.head_dim / 2;
  for (size_t k = 0; k < g.size(); ++k) {
    const int64_t col = static_cast<int64_t>(k) % c;
    double pair = std::abs(x[k]);
    if (col < o.rotated_width) {
      const int64_t j = col % o.head_dim;
      pair += std::abs(x[k + (j < half ? half : -half)]);
    }
    const double tol = unit(dt) * std::abs(want[k]) + 8 * 0x1p-24 * pair;
    ASSERT_NEAR(g[k], want[k], tol) << what << " element " << k;
  }
}

TEST(RotaryEmbedding, ForwardAndBackwardMatchFloat64InEveryDType) {
  for (DType dt : kFloatDTypes)
    for (const Case& c : kCases) {
      const std::string what = std::string(dtype_name(dt)) + " " + c.shape.to_string();
      const Tensor x = random_tensor(c.shape, 3, dt, -2.0f, 2.0f);
      const std::vector<double> xv = testing::to_doubles(x);
      const Tensor y = rotary_embedding(x, c.o);
      ASSERT_EQ(y.dtype(), dt);
      ASSERT_EQ(y.shape(), c.shape);
      expect_near_reference(y, xv, reference(xv, c.shape, c.o, 1.0), c.shape, c.o, dt, what + " forward");
      const Tensor dx = rotary_embedding_backward(x, c.o);
      ASSERT_EQ(dx.dtype(), dt);
      expect_near_reference(dx, xv, reference(xv, c.shape, c.o, -1.0), c.shape, c.o, dt, what + " backward");
    }
}

// L(x) = sum dy * y(x) in float64; its central differences give dL/dx, which the backward of dy must match.
TEST(RotaryEmbedding, BackwardMatchesFiniteDifferences) {
  const Shape shape{2, 5, 12};
  const RotaryOptions o{4, 8, 3, 10000.0};
  const Tensor x = random_tensor(shape, 8, DType::kFloat32);
  const Tensor dy = random_tensor(shape, 9, DType::kFloat32);
  const std::vector<double> xv = testing::to_doubles(x), g = testing::to_doubles(dy);
  auto loss = [&](const std::vector<double>& v) {
    const std::vector<double> y = reference(v, shape, o, 1.0);
    double l = 0;
    for (size_t k = 0; k < y.size(); ++k) l += g[k] * y[k];
    return l;
  };
  const std::vector<float> dx = rotary_embedding_backward(dy, o).to_floats();
  constexpr double kStep = 1e-4;
  for (size_t k = 0; k < xv.size(); ++k) {
    std::vector<double> up = xv, down = xv;
    up[k] += kStep;
    down[k] -= kStep;
    const double want = (loss(up) - loss(down)) / (2 * kStep);
    // L is linear in x, so the difference is exact but for float64 rounding; dx carries float32 tables and products.
    EXPECT_NEAR(dx[k], want, 1e-6 * (1.0 + std::abs(want))) << "element " << k;
  }
}

// Rows [s, T) rotated with offset 0 are the rows of x[:, s:] rotated with offset s, bit for bit: a cached step's new
// rows get the angles a whole-sequence call gives them.
TEST(RotaryEmbedding, OffsetEqualsTheSameRowsOfALongerSequence) {
  for (DType dt : kFloatDTypes) {
    const Tensor x = random_tensor({2, 19, 24}, 11, dt);
    const RotaryOptions whole{8, 16, 0, 10000.0}, tail{8, 16, 7, 10000.0};
    const std::vector<float> a = rotary_embedding(x, whole).slice(1, 7, 19).contiguous().to_floats();
    const std::vector<float> b = rotary_embedding(x.slice(1, 7, 19), tail).to_floats();  // a view input
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) ASSERT_EQ(testing::bits(a[k]), testing::bits(b[k])) << dtype_name(dt) << k;
  }
}

TEST(RotaryEmbedding, CopiesColumnsPastTheRotatedWidthAndTurnsRowZeroNot) {
  const Tensor x = random_tensor({3, 4, 20}, 12, DType::kBFloat16);
  const Tensor y = rotary_embedding(x, {4, 12, 0, 10000.0});
  const std::vector<float> xv = x.to_floats(), yv = y.to_floats();
  for (int64_t r = 0; r < 12; ++r)
    for (int64_t col = 0; col < 20; ++col) {
      const size_t k = static_cast<size_t>(r * 20 + col);
      // Past the rotated width: a copy. At position 0 every angle is 0: cos 1, sin 0, so a copy too.
      if (col >= 12 || r % 4 == 0) {
        EXPECT_EQ(yv[k], xv[k]) << "row " << r << " col " << col;
      }
    }
}

TEST(RotaryEmbedding, RefusesBadOptions) {
  const Tensor x = Tensor::zeros({1, 3, 8}, DType::kFloat32);
  EXPECT_THROW(rotary_embedding(x, {3, 6, 0, 10000.0}), Error);   // odd head_dim
  EXPECT_THROW(rotary_embedding(x, {4, 6, 0, 10000.0}), Error);   // width not a multiple of head_dim
  EXPECT_THROW(rotary_embedding(x, {4, 12, 0, 10000.0}), Error);  // wider than x
  EXPECT_THROW(rotary_embedding(x, {4, 8, -1, 10000.0}), Error);  // negative offset
  EXPECT_THROW(rotary_embedding(x, {4, 8, 0, 1.0}), Error);       // base 1: every frequency 1
  EXPECT_THROW(rotary_embedding(Tensor::zeros({3, 8}, DType::kFloat32), {4, 8, 0, 10000.0}), Error);
  EXPECT_THROW(rotary_embedding(Tensor::zeros({1, 3, 8}, DType::kInt32), {4, 8, 0, 10000.0}), Error);
}

}  // namespace
}  // namespace mixtrain::ops
