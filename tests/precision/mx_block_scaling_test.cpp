// MXFP8 block scaling (precision/mx_block_scaling.h) against a float64 reference: each block's scale is by definition
// the smallest power of two that makes its amax fit the format, every element reads back within half a unit in the
// last place of the format at that scale, blocks along columns are blocks along the rows of the transpose, and a
// block with a NaN or an infinity reads back as NaN without touching its neighbours.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "mixtrain/core/error.h"
#include "mixtrain/core/float8.h"
#include "mixtrain/core/random.h"
#include "mixtrain/precision/fp8_scaling.h"
#include "mixtrain/precision/mx_block_scaling.h"

namespace mixtrain {
namespace {

const DType kFormats[] = {DType::kFloat8E4M3FN, DType::kFloat8E5M2};

// The definition, searched in float64: the smallest k in [-127, 127] with amax <= max * 2^k.
int reference_exponent(double amax, double max) {
  int k = -127;
  while (amax > std::ldexp(max, k)) ++k;
  return k;
}

std::vector<float> random_matrix(int64_t rows, int64_t cols, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  // Magnitudes spread over many binades, so neighbouring blocks get different scales.
  for (float& v : x) v = rng.normal() * std::ldexp(1.0f, static_cast<int>(rng.below(24)) - 12);
  return x;
}

TEST(MxBlockScaling, ScaleIsTheSmallestPowerOfTwoThatFits) {
  Rng rng(9);
  for (DType f : kFormats) {
    const double max = float8_format_max(f);
    for (int i = 0; i < 20000; ++i) {
      const float amax = std::ldexp(rng.uniform() + 0.5f, static_cast<int>(rng.below(250)) - 125);
      EXPECT_EQ(mx_block_scale(amax, f), reference_exponent(amax, max) + 127) << amax;
    }
    for (int k = -120; k <= 100; ++k) {  // exactly max * 2^k fits 2^k; the next float32 up needs 2^(k+1)
      const float edge = static_cast<float>(std::ldexp(max, k));
      EXPECT_EQ(mx_block_scale(edge, f), k + 127);
      EXPECT_EQ(mx_block_scale(std::nextafter(edge, INFINITY), f), k + 128);
    }
    EXPECT_EQ(mx_block_scale(0.0f, f), 0x00);
    EXPECT_EQ(mx_block_scale(1e-44f, f), 0x00);  // below max * 2^-127: the smallest scale
    EXPECT_EQ(mx_block_scale(NAN, f), 0xFF);
    EXPECT_EQ(mx_block_scale(INFINITY, f), 0xFF);
    EXPECT_THROW(mx_block_scale(-1.0f, f), Error);
  }
}

// Each element against float64: the block's scale by the definition, and the element within half an ulp of the
// format at that scale (2^-4 relative for E4M3, 2^-3 for E5M2) plus half the smallest subnormal times the scale.
void expect_blocks_as_defined(const std::vector<float>& x, int64_t rows, int64_t cols, DType f, bool along_columns) {
  const MxQuantized q = mx_quantize(x.data(), rows, cols, f, along_columns);
  const std::vector<float> back = mx_dequantize(q);
  const int64_t line = along_columns ? rows : cols, lines = along_columns ? cols : rows;
  const int64_t per_line = (line + kMxBlockSize - 1) / kMxBlockSize;
  ASSERT_EQ(static_cast<int64_t>(q.scales.size()), per_line * lines);
  const double rel = f == DType::kFloat8E4M3FN ? 0.0625 : 0.125;
  const double sub = f == DType::kFloat8E4M3FN ? std::ldexp(1.0, -10) : std::ldexp(1.0, -17);
  for (int64_t l = 0; l < lines; ++l)
    for (int64_t b = 0; b < per_line; ++b) {
      const auto index = [&](int64_t j) { return along_columns ? j * cols + l : l * cols + j; };
      double amax = 0;
      for (int64_t j = b * kMxBlockSize; j < std::min(line, (b + 1) * kMxBlockSize); ++j)
        amax = std::max(amax, std::fabs(static_cast<double>(x[static_cast<size_t>(index(j))])));
      const int k = reference_exponent(amax, float8_format_max(f));
      const size_t s = static_cast<size_t>(along_columns ? b * cols + l : l * per_line + b);
      ASSERT_EQ(q.scales[s], k + 127) << "line " << l << " block " << b;
      for (int64_t j = b * kMxBlockSize; j < std::min(line, (b + 1) * kMxBlockSize); ++j) {
        const size_t i = static_cast<size_t>(index(j));
        const double err = std::fabs(static_cast<double>(back[i]) - x[i]);
        ASSERT_LE(err, rel * std::fabs(x[i]) + sub * std::ldexp(1.0, k)) << "element " << i;
      }
    }
}

TEST(MxBlockScaling, RowAndColumnBlocksMatchFloat64OnOddShapes) {
  const int64_t shapes[][2] = {{1, 1}, {7, 45}, {33, 31}, {64, 64}, {17, 129}};
  for (DType f : kFormats)
    for (const auto& s : shapes) {
      const std::vector<float> x = random_matrix(s[0], s[1], static_cast<uint64_t>(s[0] * 1000 + s[1]));
      for (bool along_columns : {false, true}) expect_blocks_as_defined(x, s[0], s[1], f, along_columns);
    }
}

TEST(MxBlockScaling, ColumnBlocksAreRowBlocksOfTheTranspose) {
  const int64_t rows = 45, cols = 70;
  const std::vector<float> x = random_matrix(rows, cols, 11);
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[static_cast<size_t>(c * rows + r)] = x[static_cast<size_t>(r * cols + c)];
  const MxQuantized by_col = mx_quantize(x.data(), rows, cols, DType::kFloat8E4M3FN, true);
  const MxQuantized by_row_t = mx_quantize(t.data(), cols, rows, DType::kFloat8E4M3FN, false);
  const int64_t blocks = (rows + kMxBlockSize - 1) / kMxBlockSize;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(by_col.codes[static_cast<size_t>(r * cols + c)], by_row_t.codes[static_cast<size_t>(c * rows + r)]);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(by_col.scales[static_cast<size_t>(b * cols + c)], by_row_t.scales[static_cast<size_t>(c * blocks + b)]);
}

TEST(MxBlockScaling, ANonFiniteElementMakesItsBlockNaN) {
  std::vector<float> x = random_matrix(2, 64, 12);
  x[40] = INFINITY;  // row 0, second block
  x[64 + 3] = NAN;   // row 1, first block
  const MxQuantized q = mx_quantize(x.data(), 2, 64, DType::kFloat8E4M3FN, false);
  ASSERT_EQ(q.scales.size(), 4u);
  EXPECT_EQ(q.scales[1], 0xFF);
  EXPECT_EQ(q.scales[2], 0xFF);
  EXPECT_NE(q.scales[0], 0xFF);
  EXPECT_NE(q.scales[3], 0xFF);
  const std::vector<float> back = mx_dequantize(q);
  for (int64_t i = 0; i < 128; ++i) {
    const bool poisoned = (i >= 32 && i < 64) || (i >= 64 && i < 96);
    EXPECT_EQ(std::isnan(back[static_cast<size_t>(i)]), poisoned) << i;
  }
  EXPECT_THROW(mx_quantize(x.data(), 2, 64, DType::kFloat16, false), Error);
}

}  // namespace
}  // namespace mixtrain
