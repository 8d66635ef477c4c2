// ops::mx_block_quantize against MXFP8's definition (mx_block_reference.h: block scales searched in float64, codes
// from the formats' definition), and the product of two block-quantized operands on scaled_matmul against the
// float64 product of the dequantized matrices.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "mixtrain/core/error.h"
#include "mixtrain/ops/fp8_gemm.h"
#include "mx_block_reference.h"
#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

namespace ref = float8_reference;
using mx_test::mx_dequantized;

const ref::Format& format_of(DType d) { return d == DType::kFloat8E5M2 ? ref::kE5M2 : ref::kE4M3; }
double max_of(DType d) { return d == DType::kFloat8E5M2 ? 57344.0 : 448.0; }

// Magnitudes over 2^-20 .. 2^7 so that blocks get different scales and some elements fall into the subnormals of
// their block's format; all stay inside bfloat16's normal range, where the widening is exact.
std::vector<float> wide_values(int64_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = std::ldexp(r.uniform(-1.0f, 1.0f), static_cast<int>(r.uniform(-20.0f, 8.0f)));
  if (n > 3) v[1] = -0.0f, v[2] = 0.0f;
  return v;
}

// Bit-exact: both sides are exact values (the dequantized values are bfloat16 values here).
TEST(MxBlockQuantize, EqualsTheDefinitionElementByElement) {
  for (DType format : {DType::kFloat8E4M3FN, DType::kFloat8E5M2})
    for (DType in : {DType::kFloat32, DType::kBFloat16, DType::kFloat16})
      for (bool down : {false, true})
        for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {7, 45}, {33, 31}, {17, 129}, {64, 96}}) {
          const Tensor x = Tensor::from_floats({rows, cols}, wide_values(rows * cols, rows * 131 + cols), in);
          const std::vector<double> want =
              mx_dequantized(x.to_floats(), rows, cols, format_of(format), max_of(format), down);
          const Tensor q = mx_block_quantize(x, format, down);
          ASSERT_EQ(q.dtype(), DType::kBFloat16);
          ASSERT_EQ(q.shape(), x.shape());
          const std::vector<float> got = q.to_floats();
          for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_EQ(static_cast<double>(got[i]), want[i])
                << dtype_name(format) << " " << dtype_name(in) << (down ? " down " : " along ") << rows << "x" << cols
                << " at " << i;
            ASSERT_EQ(std::signbit(got[i]), std::signbit(want[i])) << i;
          }
        }
}

// Above the parallel threshold the panels are split across threads: the same values as the definition.
TEST(MxBlockQuantize, LargeMatricesEqualTheDefinition) {
  const int64_t rows = 300, cols = 257;
  const Tensor x = Tensor::from_floats({rows, cols}, wide_values(rows * cols, 5));
  for (bool down : {false, true}) {
    const std::vector<double> want = mx_dequantized(x.to_floats(), rows, cols, ref::kE4M3, 448.0, down);
    const std::vector<float> got = mx_block_quantize(x, DType::kFloat8E4M3FN, down).to_floats();
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(static_cast<double>(got[i]), want[i]) << down << " " << i;
  }
}

// The scale is rounded up: a block's largest element never saturates, and a value exactly at format max * 2^k
// keeps that scale (448 * 2 = 896 stays 896; 897 moves to the next power and rounds to 896 there).
TEST(MxBlockQuantize, TheScaleRoundsUpSoNothingSaturates) {
  const Tensor x = Tensor::from_floats({2, 2}, {896.0f, 1.0f, 897.0f, 1e-3f});
  const std::vector<float> q = mx_block_quantize(x, DType::kFloat8E4M3FN, false).to_floats();
  EXPECT_EQ(q[0], 896.0f);
  EXPECT_EQ(q[1], 1.0f);  // 2^-1 exactly in E4M3 at scale 2
  EXPECT_EQ(q[2], 896.0f);
  EXPECT_EQ(q[3], 0.0f) << "1e-3 / 4 is below half of E4M3's smallest subnormal (2^-10)";
}

// A block holding NaN or infinity reads NaN; its neighbours (other rows, or the next 32 elements) do not.
TEST(MxBlockQuantize, ANonFiniteElementPoisonsOnlyItsBlock) {
  std::vector<float> v(2 * 40, 1.5f);
  v[3] = NAN;
  v[40 + 35] = INFINITY;
  const std::vector<float> q =
      mx_block_quantize(Tensor::from_floats({2, 40}, v), DType::kFloat8E5M2, false).to_floats();
  for (int64_t i = 0; i < 80; ++i) {
    const bool poisoned = i < 32 || i >= 72;
    EXPECT_EQ(std::isnan(q[i]), poisoned) << i;
    if (!poisoned) {
      EXPECT_EQ(q[i], 1.5f) << i;
    }
  }
}

TEST(MxBlockQuantize, RefusesWhatItCannotQuantize) {
  const Tensor m = Tensor::from_floats({2, 2}, {1, 2, 3, 4});
  EXPECT_THROW(mx_block_quantize(Tensor::from_floats({4}, {1, 2, 3, 4}), DType::kFloat8E4M3FN, false), Error);
  EXPECT_THROW(mx_block_quantize(m, DType::kBFloat16, false), Error);
  EXPECT_THROW(mx_block_quantize(m, DType::kFloat8E8M0FNU, false), Error);
}

// x over float32's whole range (mx_test::every_range_values), in `in`.
Tensor every_range(int64_t rows, int64_t cols, DType in) {
  return Tensor::from_floats({rows, cols}, mx_test::every_range_values(rows, cols, false), in);
}

std::vector<uint16_t> bfloat16_bits(const Tensor& t) {
  std::vector<uint16_t> b(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) b[static_cast<size_t>(i)] = t.data<bfloat16>()[i].bits;
  return b;
}

// The stored form decodes to mx_block_quantize's bfloat16 bits, over float32's whole range (scales from 2^-127,
// non-finite blocks, zeros), each input dtype, both formats and directions, ragged and parallel shapes; and the
// codes and scale bytes themselves are the definition's: each element's code value times its block's 2^(byte -
// 127), in float64, is the reference's dequantized value exactly (and NaN blocks carry the NaN byte).
TEST(MxBlockEncode, DecodesToMxBlockQuantizesBitsAndIsTheDefinitionsCodesAndScales) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {7, 45}, {33, 31}, {17, 129}, {70, 64}, {300, 257}})
    for (DType in : {DType::kFloat32, DType::kBFloat16, DType::kFloat16})
      for (DType format : {DType::kFloat8E4M3FN, DType::kFloat8E5M2})
        for (bool down : {false, true}) {
          const std::string what = std::to_string(rows) + "x" + std::to_string(cols) + " " + dtype_name(in) + " " +
                                   dtype_name(format) + (down ? " down" : " along");
          const Tensor x = every_range(rows, cols, in);
          const MxBlockCodes q = mx_block_encode(x, format, down);
          ASSERT_EQ(q.codes.dtype(), format) << what;
          ASSERT_EQ(q.codes.shape(), x.shape()) << what;
          ASSERT_EQ(q.scales.dtype(), DType::kFloat8E8M0FNU) << what;
          const Shape scales_shape = down ? Shape{(rows + 31) / 32, cols} : Shape{rows, (cols + 31) / 32};
          ASSERT_EQ(q.scales.shape(), scales_shape) << what;
          EXPECT_EQ(bfloat16_bits(mx_block_decode(q)), bfloat16_bits(mx_block_quantize(x, format, down))) << what;
          const std::vector<double> want =
              mx_dequantized(x.to_floats(), rows, cols, format_of(format), max_of(format), down);
          const uint8_t* codes = static_cast<const uint8_t*>(q.codes.raw());
          const uint8_t* scales = static_cast<const uint8_t*>(q.scales.raw());
          int64_t differ = 0;
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c) {
              const int64_t i = r * cols + c;
              const uint8_t byte = scales[down ? (r / 32) * cols + c : r * q.scales.dim(1) + c / 32];
              const double w = want[static_cast<size_t>(i)];
              if (std::isnan(w)) {
                differ += byte != 0xFF;
                continue;
              }
              differ += std::ldexp(ref::value(format_of(format), codes[i]), byte - 127) != w;
            }
          EXPECT_EQ(differ, 0) << what;
        }
}

// A column slice of the stored form (blocks down the columns: codes and scales sliced alike) decodes to the same
// columns of the whole: how the weight gradient widens the kept input a block of columns at a time.
TEST(MxBlockEncode, AColumnSliceDecodesToThoseColumns) {
  const Tensor x = every_range(70, 300, DType::kBFloat16);
  const MxBlockCodes q = mx_block_encode(x, DType::kFloat8E4M3FN, true);
  const Tensor whole = mx_block_decode(q);
  for (auto [c0, c1] : {std::pair<int64_t, int64_t>{0, 256}, {256, 300}, {17, 18}}) {
    const Tensor part = mx_block_decode({q.codes.slice(1, c0, c1), q.scales.slice(1, c0, c1), true});
    EXPECT_EQ(bfloat16_bits(part), bfloat16_bits(whole.slice(1, c0, c1).contiguous())) << c0 << ".." << c1;
  }
}

TEST(MxBlockEncode, RefusesWhatItCannotEncodeOrDecode) {
  const Tensor m = Tensor::from_floats({40, 2}, std::vector<float>(80, 1.0f));
  EXPECT_THROW(mx_block_encode(Tensor::from_floats({4}, {1, 2, 3, 4}), DType::kFloat8E4M3FN, false), Error);
  EXPECT_THROW(mx_block_encode(m, DType::kFloat8E8M0FNU, true), Error);
  const MxBlockCodes q = mx_block_encode(m, DType::kFloat8E4M3FN, true);
  EXPECT_THROW(mx_block_decode({q.codes, q.scales, false}), Error) << "scales of the other direction's shape";
  EXPECT_THROW(mx_block_decode({q.codes, Tensor::zeros(q.scales.shape(), DType::kUInt8), true}), Error);
  EXPECT_THROW(mx_block_decode({m, q.scales, true}), Error) << "values, not codes";
}

// y = A B with A blocked along its rows and B down its columns (the forward product), and dx = G W^T with both
// blocked along their rows (the backward one, W read transposed): the bfloat16 GEMM's float32 sums against the
// float64 product of the dequantized matrices. Tolerance: k float32 additions (k 2^-24 of sum |a b|) and one rounding
// of the float32 result; the products themselves are exact (bfloat16 operands, float32 accumulation).
TEST(MxBlockQuantize, ProductsOfBlockedOperandsEqualTheDequantizedProduct) {
  for (auto [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{7, 45, 17}, {33, 96, 31}, {5, 129, 8}})
    for (bool trans_b : {false, true}) {
      const std::vector<float> av = wide_values(m * k, 7 * m), bv = wide_values(k * n, 11 * n);
      const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
      const Tensor a = Tensor::from_floats({m, k}, av), b = Tensor::from_floats({b_rows, b_cols}, bv);
      const std::vector<double> ad = mx_dequantized(av, m, k, ref::kE4M3, 448.0, false);
      const std::vector<double> bd = mx_dequantized(bv, b_rows, b_cols, ref::kE5M2, 57344.0, /*down=*/!trans_b);
      const Tensor c = scaled_matmul(mx_block_quantize(a, DType::kFloat8E4M3FN, false),
                                     mx_block_quantize(b, DType::kFloat8E5M2, !trans_b), false, trans_b, 1.0f,
                                     Tensor(), DType::kFloat32);
      const std::vector<float> got = c.to_floats();
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double want = 0, abs_sum = 0;
          for (int64_t t = 0; t < k; ++t) {
            const double p = ad[i * k + t] * bd[trans_b ? j * k + t : t * n + j];
            want += p;
            abs_sum += std::fabs(p);
          }
          ASSERT_NEAR(got[i * n + j], want, (k + 1) * 0x1p-24 * abs_sum + 1e-30) << m << "x" << k << "x" << n;
        }
    }
}

}  // namespace
}  // namespace mixtrain::ops
