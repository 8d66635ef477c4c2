// The FP8 GEMM pieces against their definitions: fp8_quantize against the float8 formats computed in float64 from
// sign, exponent and mantissa (tests/core/float8_reference.h, no code of the converter), scaled_matmul against a
// float64 product.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../core/float8_reference.h"
#include "mixtrain/core/error.h"
#include "mixtrain/core/isa_level.h"
#include "mixtrain/ops/fp8_gemm.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

namespace ref = float8_reference;
using testing::kOddSizes;

const ref::Format& format_of(DType d) { return d == DType::kFloat8E5M2 ? ref::kE5M2 : ref::kE4M3; }

// Inputs spanning the formats' ranges: normal values, values that scale into the subnormals, signed zeros, and a few
// past the largest finite value after scaling (E4M3 saturates, E5M2 overflows to infinity).
std::vector<float> wide_values(int64_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = std::ldexp(r.uniform(-1.0f, 1.0f), static_cast<int>(r.uniform(-20.0f, 4.0f)));
  if (n > 3) v[1] = -0.0f, v[2] = 0.0f;
  return v;
}

// Returns the instruction-set level to its default when a test ends, however it ends.
struct DefaultIsaAtExit {
  ~DefaultIsaAtExit() { set_isa_level_for_testing(std::nullopt); }
};

// Every element of x (rounded to the input dtype first) against the definition: the value of the code that
// x * scale (in float32) encodes to, saturating for E4M3 and not for E5M2. Bit-exact: both sides are exact values.
// At every instruction-set level this CPU has (AVX-512 casts float32 and bfloat16 blocks in one pass, the others in
// several), on sizes that end inside a vector step and span several blocks of the kernel.
TEST(Fp8Quantize, EqualsTheFormatDefinitionElementByElement) {
  DefaultIsaAtExit reset;
  for (IsaLevel level : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    if (set_isa_level_for_testing(level) != level) continue;  // the CPU lacks it
    SCOPED_TRACE(isa_level_name(level));
    for (DType format : {DType::kFloat8E4M3FN, DType::kFloat8E5M2})
      for (DType in : {DType::kFloat32, DType::kBFloat16, DType::kFloat16})
        for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{33}, int64_t{129}, int64_t{5000}}) {
          const Tensor x = Tensor::from_floats({n}, wide_values(n, 17 + n), in);
          const std::vector<float> xs = x.to_floats();
          const float scale = 96.0f;  // pushes the largest inputs (up to 16) past both formats' maxima or near them
          const Fp8Operand q = fp8_quantize(x, format, scale);
          ASSERT_EQ(q.values.dtype(), DType::kBFloat16);
          const std::vector<float> got = q.values.to_floats();
          double amax = 0.0;
          for (int64_t i = 0; i < n; ++i) {
            const float scaled = xs[i] * scale;
            const uint8_t code = *ref::encode(format_of(format), scaled, format == DType::kFloat8E4M3FN);
            const double want = ref::value(format_of(format), code);
            EXPECT_EQ(static_cast<double>(got[i]), want) << dtype_name(format) << " " << dtype_name(in) << " x " << xs[i];
            EXPECT_EQ(std::signbit(got[i]), std::signbit(want)) << xs[i];
            amax = std::max(amax, std::fabs(static_cast<double>(xs[i])));
          }
          EXPECT_EQ(static_cast<double>(q.amax), amax);
          EXPECT_EQ(fp8_amax(x), q.amax);
        }
  }
}

// Saturating E5M2 (what the FP8 layers ask for) against the definition: the largest finite value in place of infinity.
TEST(Fp8Quantize, SaturatesE5m2WhenAsked) {
  const int64_t n = 300;
  const Tensor x = Tensor::from_floats({n}, wide_values(n, 41));
  const std::vector<float> xs = x.to_floats();
  const float scale = 30000.0f;  // most of the values overflow E5M2 (57344)
  const std::vector<float> got = fp8_quantize(x, DType::kFloat8E5M2, scale, Float8Overflow::kSaturate).values.to_floats();
  int saturated = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double want = ref::value(ref::kE5M2, *ref::encode(ref::kE5M2, xs[i] * scale, /*saturate=*/true));
    EXPECT_EQ(static_cast<double>(got[i]), want) << xs[i];
    saturated += std::fabs(want) == 57344.0;
  }
  EXPECT_GT(saturated, 10);
}

TEST(Fp8Quantize, NanPropagatesToTheValueAndTheAmax) {
  const Tensor x = Tensor::from_floats({5}, {1.0f, NAN, -2.0f, INFINITY, 0.5f});
  for (DType format : {DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
    const Fp8Operand q = fp8_quantize(x, format, 1.0f);
    const std::vector<float> v = q.values.to_floats();
    EXPECT_TRUE(std::isnan(q.amax));
    EXPECT_TRUE(std::isnan(v[1]));
    EXPECT_EQ(v[2], -2.0f);
    // E4M3 saturates an infinity to 448; E5M2 keeps it.
    EXPECT_EQ(v[3], format == DType::kFloat8E5M2 ? INFINITY : 448.0f);
  }
}

TEST(Fp8Quantize, RefusesBadFormatsAndScales) {
  const Tensor x = Tensor::from_floats({2}, {1.0f, 2.0f});
  EXPECT_THROW(fp8_quantize(x, DType::kBFloat16, 1.0f), Error);
  EXPECT_THROW(fp8_quantize(x, DType::kFloat8E8M0FNU, 1.0f), Error);
  for (float bad : {0.0f, -1.0f, INFINITY, NAN}) EXPECT_THROW(fp8_quantize(x, DType::kFloat8E4M3FN, bad), Error);
  EXPECT_THROW(fp8_amax(x.to(DType::kFloat8E4M3FN)), Error);
}

// c = alpha * op(a) op(b) + bias against float64. Tolerance: the float32 sum of k exact bfloat16 products is within
// k 2^-24 of sum |a b| (the recursive-summation bound), alpha's and the bias's float32 operations add 2 2^-24 of
// |alpha| sum |a b| + |bias|, and the one rounding into the output adds unit(out) |c|.
TEST(ScaledMatmul, EqualsAFloat64ProductWithAlphaAndBias) {
  for (int64_t m : kOddSizes)
    for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{129}})
      for (int64_t k : {int64_t{1}, int64_t{31}, int64_t{300}})
        for (int t = 0; t < 4; ++t)
          for (DType out : {DType::kBFloat16, DType::kFloat32}) {
            const bool ta = t & 1, tb = t & 2;
            const Tensor a = testing::random_tensor(ta ? Shape{k, m} : Shape{m, k}, m * 7 + k, DType::kBFloat16);
            const Tensor b = testing::random_tensor(tb ? Shape{n, k} : Shape{k, n}, n * 5 + k, DType::kBFloat16);
            const Tensor bias = testing::random_tensor({n}, n + 3, DType::kFloat32);
            const float alpha = 1.0f / 3000.0f;
            const std::vector<float> c = scaled_matmul(a, b, ta, tb, alpha, bias, out).to_floats();
            const std::vector<float> av = a.to_floats(), bv = b.to_floats(), biasv = bias.to_floats();
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j) {
                double s = 0, abs_s = 0;
                for (int64_t p = 0; p < k; ++p) {
                  const double x = av[ta ? p * m + i : i * k + p], y = bv[tb ? j * k + p : p * n + j];
                  s += x * y;
                  abs_s += std::fabs(x * y);
                }
                const double want = alpha * s + biasv[j];
                const double tol = (k + 2) * 0x1p-24 * (alpha * abs_s + std::fabs(biasv[j])) +
                                   testing::unit(out) * std::fabs(want);
                ASSERT_NEAR(c[i * n + j], want, tol) << m << "x" << n << "x" << k << " t" << t;
              }
          }
}

TEST(ScaledMatmul, WritesIntoAGivenOutputAndChecksShapes) {
  const Tensor a = testing::random_tensor({4, 3}, 1, DType::kBFloat16);
  const Tensor b = testing::random_tensor({3, 5}, 2, DType::kBFloat16);
  Tensor into = Tensor::zeros({4, 5}, DType::kFloat32);
  const Tensor c = scaled_matmul(a, b, false, false, 2.0f, Tensor(), DType::kFloat32, into);
  EXPECT_EQ(c.raw(), into.raw());
  const std::vector<float> plain = scaled_matmul(a, b, false, false, 1.0f, Tensor(), DType::kFloat32).to_floats();
  const std::vector<float> twice = into.to_floats();
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(twice[i], 2.0f * plain[i]);  // doubling is exact
  EXPECT_THROW(scaled_matmul(a, a, false, false, 1.0f, Tensor(), DType::kFloat32), Error);
  EXPECT_THROW(scaled_matmul(a, b, false, false, 1.0f, Tensor::zeros({4}, DType::kFloat32), DType::kFloat32), Error);
  EXPECT_THROW(scaled_matmul(a, b, false, false, 1.0f, Tensor(), DType::kFloat32, Tensor::zeros({5, 4}, DType::kFloat32)),
               Error);
}

}  // namespace
}  // namespace mixtrain::ops
