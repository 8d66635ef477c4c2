#include "mixtrain/precision/mx_block_scaling.h"

#include <algorithm>
#include <cmath>

#include "mixtrain/core/error.h"
#include "mixtrain/core/float8.h"
#include "mixtrain/precision/fp8_scaling.h"

namespace mixtrain {

namespace {
// One block: `count` elements from `first`, `stride` apart, and the place of its scale.
struct Block {
  int64_t first, stride, count, scale_index;
};

// Every block of the layout, in the order of the scales.
std::vector<Block> blocks_of(int64_t rows, int64_t cols, bool along_columns) {
  std::vector<Block> out;
  if (along_columns) {
    for (int64_t b = 0; b * kMxBlockSize < rows; ++b)
      for (int64_t c = 0; c < cols; ++c)
        out.push_back({b * kMxBlockSize * cols + c, cols, std::min(kMxBlockSize, rows - b * kMxBlockSize),
                       static_cast<int64_t>(out.size())});
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b * kMxBlockSize < cols; ++b)
        out.push_back({r * cols + b * kMxBlockSize, 1, std::min(kMxBlockSize, cols - b * kMxBlockSize),
                       static_cast<int64_t>(out.size())});
  }
  return out;
}

uint8_t encode(float x, DType format) {
  return format == DType::kFloat8E5M2 ? float_to_e5m2_bits(x, Float8Overflow::kSaturate)
                                      : float_to_e4m3_bits(x, Float8Overflow::kSaturate);
}
float decode(uint8_t code, DType format) {
  return format == DType::kFloat8E5M2 ? e5m2_bits_to_float(code) : e4m3_bits_to_float(code);
}
}  // namespace

uint8_t mx_block_scale(float amax, DType format) {
  const double max = float8_format_max(format);
  if (std::isnan(amax) || std::isinf(amax)) return 0xFF;
  MIXTRAIN_CHECK(amax >= 0.0f, "mx_block_scale: amax must not be negative, got " << amax);
  if (amax == 0.0f) return 0x00;
  // The smallest k with amax <= max * 2^k; ldexp of a double is exact here, so the comparisons are.
  int k = static_cast<int>(std::ceil(std::log2(static_cast<double>(amax) / max)));
  while (k > -127 && static_cast<double>(amax) <= std::ldexp(max, k - 1)) --k;
  while (static_cast<double>(amax) > std::ldexp(max, k)) ++k;
  return static_cast<uint8_t>(std::max(k, -127) + 127);
}

MxQuantized mx_quantize(const float* x, int64_t rows, int64_t cols, DType format, bool along_columns) {
  MIXTRAIN_CHECK(rows >= 0 && cols >= 0, "mx_quantize: the shape (" << rows << ", " << cols << ") is negative");
  float8_format_max(format);  // refuses a dtype that is not an FP8 element format
  MxQuantized q{format, along_columns, rows, cols, std::vector<uint8_t>(static_cast<size_t>(rows * cols)), {}};
  const std::vector<Block> blocks = blocks_of(rows, cols, along_columns);
  q.scales.resize(blocks.size());
  for (const Block& b : blocks) {
    float amax = 0.0f;
    for (int64_t j = 0; j < b.count; ++j) amax = std::max(amax, std::fabs(x[b.first + j * b.stride]));
    bool finite = true;
    for (int64_t j = 0; j < b.count; ++j) finite = finite && std::isfinite(x[b.first + j * b.stride]);
    const uint8_t scale = finite ? mx_block_scale(amax, format) : uint8_t{0xFF};
    q.scales[static_cast<size_t>(b.scale_index)] = scale;
    const int shift = scale == 0xFF ? 0 : scale - 127;  // x / 2^shift: exact but where it falls below float32's normals
    for (int64_t j = 0; j < b.count; ++j) {
      const int64_t i = b.first + j * b.stride;
      q.codes[static_cast<size_t>(i)] = encode(std::ldexp(x[i], -shift), format);
    }
  }
  return q;
}

std::vector<float> mx_dequantize(const MxQuantized& q) {
  std::vector<float> out(q.codes.size());
  for (const Block& b : blocks_of(q.rows, q.cols, q.along_columns)) {
    const uint8_t scale = q.scales[static_cast<size_t>(b.scale_index)];
    for (int64_t j = 0; j < b.count; ++j) {
      const int64_t i = b.first + j * b.stride;
      const float v = decode(q.codes[static_cast<size_t>(i)], q.format);
      out[static_cast<size_t>(i)] = scale == 0xFF ? NAN : std::ldexp(v, scale - 127);
    }
  }
  return out;
}

Fp8CastStats mx_cast_stats(const float* x, int64_t rows, int64_t cols, DType format, bool along_columns) {
  Fp8CastStats out;
  float block[kMxBlockSize];
  for (const Block& b : blocks_of(rows, cols, along_columns)) {
    float amax = 0.0f;
    for (int64_t j = 0; j < b.count; ++j) {
      block[j] = x[b.first + j * b.stride];
      amax = std::max(amax, std::fabs(block[j]));
    }
    const uint8_t code = mx_block_scale(amax, format);
    out.merge(fp8_cast_stats(block, b.count, format, code == 0xFF ? 1.0f : std::ldexp(1.0f, 127 - code)));
  }
  return out;
}

}  // namespace mixtrain
