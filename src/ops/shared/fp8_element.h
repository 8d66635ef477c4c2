// The element steps of FP8 quantization (ops/fp8_gemm.h) and of the float8 casts, written once for the CPU and the
// GPU: core/float8.h's conversions (host-and-device code) composed into what one element of each kernel computes.
// The CPU kernels reach the same bits through core's array conversions; tests/ops/cuda_fp8_shared_test.cpp holds
// these steps to the CPU ops on every code, so the GPU kernels built on them give the CPU's bits.
#pragma once

#include <cstdint>

#include "float16_convert.h"
#include "host_device.h"
#include "mixtrain/core/float8.h"
#include "mixtrain/core/half.h"

namespace mixtrain::ops::shared {

// |x| as float32 bits: the amax's order key. For non-negative floats the integer order is the value order, and
// every NaN's magnitude bits lie above infinity's, so the integer maximum of the keys is the amax with NaN winning,
// whatever order a reduction combines them in.
MIXTRAIN_HOST_DEVICE inline uint32_t amax_key(float x) { return bits_of(x) & 0x7FFFFFFFu; }

// The amax a key maximum stands for: the float itself, or NaN when any element was NaN.
MIXTRAIN_HOST_DEVICE inline float amax_from_key(uint32_t key) {
  return key > 0x7F800000u ? float_of(0x7FC00000u) : float_of(key);
}

// The float8 code of v in E4M3 (e5m2 false) or E5M2, to nearest even, overflow as given (core/float8.h).
MIXTRAIN_HOST_DEVICE inline uint8_t float8_code(float v, bool e5m2, Float8Overflow overflow) {
  return e5m2 ? float_to_e5m2_bits(v, overflow) : float_to_e4m3_bits(v, overflow);
}

// What a cast into the format does with overflow, on either device (core's convert_elements, from_float): E4M3
// saturates, E5M2 keeps infinity.
MIXTRAIN_HOST_DEVICE inline Float8Overflow cast_overflow(bool e5m2) {
  return e5m2 ? Float8Overflow::kNonSaturating : Float8Overflow::kSaturate;
}

// The exact value of a float8 code (a float32 value, and a bfloat16 one).
MIXTRAIN_HOST_DEVICE inline float float8_value(uint8_t code, bool e5m2) {
  return e5m2 ? e5m2_bits_to_float(code) : e4m3_bits_to_float(code);
}

// One element of fp8_quantize: x * scale rounded to float32 (never fused), then to the format, then widened to
// bfloat16 (exact: every E4M3 and E5M2 value is a bfloat16 value, NaN keeping its sign and top payload bits).
MIXTRAIN_HOST_DEVICE inline uint16_t fp8_quantized_bfloat16(float x, float scale, bool e5m2, Float8Overflow overflow) {
  return float_to_bf16_bits(float8_value(float8_code(mul_rn(x, scale), e5m2, overflow), e5m2));
}

// Whether v is exactly a value of the format (NaN counts as one: both formats have it; zeros keep their sign), so
// that float8_code(v, e5m2, kNonSaturating) holds it with no rounding. A GEMM operand made by fp8_quantize is a
// value of its format; the FP8 GEMM reads such operands as codes.
MIXTRAIN_HOST_DEVICE inline bool is_float8_value(float v, bool e5m2) {
  const uint32_t b = bits_of(v);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return true;
  return bits_of(float8_value(float8_code(v, e5m2, Float8Overflow::kNonSaturating), e5m2)) == b;
}

// MXFP8 (ops::mx_block_quantize; precision/mx_block_scaling.h): blocks of 32 consecutive elements along a row or
// down a column, each with the scale 2^k, k the smallest (at least -127) with the block's amax <= format max * 2^k.
inline constexpr int64_t kMxBlock = 32;

// k from the block's amax key (finite). Both formats' largest values are 0.875 * 2^max_exp (max_exp 9 for E4M3, 16
// for E5M2), and amax = m 2^e with m in [0.5, 1), so k = e - max_exp, one more when m > 0.875 (its fraction bits
// past 0x600000). Exact, from the bits: the CPU kernel's frexp rule.
MIXTRAIN_HOST_DEVICE inline int mx_block_exponent(uint32_t amax_key, int max_exp) {
  if (amax_key == 0) return -127;
  int exp_field = static_cast<int>(amax_key >> 23);
  uint32_t fraction = amax_key & 0x7FFFFFu;
  if (exp_field == 0) {  // a subnormal amax: normalize its fraction
    int top = 22;
    while (((fraction >> top) & 1u) == 0) --top;
    fraction = (fraction << (23 - top)) & 0x7FFFFFu;
    exp_field = top - 22;
  }
  const int k = exp_field - 126 - max_exp + (fraction > 0x600000u ? 1 : 0);
  return k < -127 ? -127 : k;
}

// 2^j as a float32 for j in [-127, 127] (2^-127 is a subnormal).
MIXTRAIN_HOST_DEVICE inline float power_of_two(int j) {
  return j >= -126 ? float_of(static_cast<uint32_t>(j + 127) << 23) : float_of(0x00400000u);
}

// Where block `block` of a (rows, cols) row-major matrix lies: blocks along rows are numbered row by row, ceil(cols /
// 32) a row; blocks down columns (down) band by band of 32 rows, cols a band. In that numbering the block scales lie
// as a row-major (rows, ceil(cols / 32)) or (ceil(rows / 32), cols) matrix.
struct MxBlockSpan {
  int64_t first, step, count;  // the block's elements: first + j * step, j < count
};
MIXTRAIN_HOST_DEVICE inline MxBlockSpan mx_block_span(int64_t rows, int64_t cols, bool down, int64_t block) {
  const int64_t per_row = (cols + kMxBlock - 1) / kMxBlock;
  const int64_t r0 = down ? (block / cols) * kMxBlock : block / per_row;
  const int64_t c0 = down ? block % cols : (block % per_row) * kMxBlock;
  const int64_t count = down ? (rows - r0 < kMxBlock ? rows - r0 : kMxBlock)
                             : (cols - c0 < kMxBlock ? cols - c0 : kMxBlock);
  return {r0 * cols + c0, down ? cols : 1, count};
}

// The E8M0 byte (core/float8.h's float8_e8m0fnu) of a block scale 2^k: k + 127; kMxNonFinite for a block that held NaN
// or an infinity, which reads back as NaN.
inline constexpr uint8_t kMxNonFinite = 0xFF;

// The block's elements of x (dtype code x_code) encoded: each x / 2^k (exact) to its code (saturating: nothing
// exceeds the max), element j's at codes[j * codes_step] (codes_step: s.step in a matrix of x's layout, 1 in a
// block's own array); returns the block's scale byte.
MIXTRAIN_HOST_DEVICE inline uint8_t mx_encode_block(const void* x, int x_code, MxBlockSpan s, bool e5m2,
                                                    uint8_t* codes, int64_t codes_step) {
  uint32_t key = 0;
  for (int64_t j = 0; j < s.count; ++j) {
    const uint32_t kj = amax_key(load_as_float(x, x_code, s.first + j * s.step));
    key = kj > key ? kj : key;
  }
  const bool finite = key < 0x7F800000u;
  const int k = finite ? mx_block_exponent(key, e5m2 ? 16 : 9) : 0;
  const float inverse = power_of_two(-k);
  for (int64_t j = 0; j < s.count; ++j)
    codes[j * codes_step] =
        float8_code(mul_rn(load_as_float(x, x_code, s.first + j * s.step), inverse), e5m2, Float8Overflow::kSaturate);
  return finite ? static_cast<uint8_t>(k + 127) : kMxNonFinite;
}

// The block's codes (element j's at codes[j * codes_step]) widened: each code's value times 2^k, rounded to
// bfloat16, into out (bfloat16 bits, the block's places in x's layout).
MIXTRAIN_HOST_DEVICE inline void mx_decode_block(const uint8_t* codes, int64_t codes_step, uint8_t scale,
                                                 MxBlockSpan s, bool e5m2, uint16_t* out) {
  const bool finite = scale != kMxNonFinite;
  const float power = power_of_two(finite ? static_cast<int>(scale) - 127 : 0);
  for (int64_t j = 0; j < s.count; ++j)
    out[s.first + j * s.step] =
        float_to_bf16_bits(finite ? mul_rn(float8_value(codes[j * codes_step], e5m2), power) : float_of(0x7FC00000u));
}

// Block `block` of the (rows, cols) row-major x quantized into out (bfloat16 bits, x's layout): the two steps above
// through the block's own array of codes. The CPU kernel's operations in order; a block with NaN or an infinity
// reads back as NaN.
MIXTRAIN_HOST_DEVICE inline void mx_quantize_block(const void* x, int x_code, int64_t rows, int64_t cols, bool down,
                                                   int64_t block, bool e5m2, uint16_t* out) {
  const MxBlockSpan s = mx_block_span(rows, cols, down, block);
  uint8_t codes[kMxBlock];
  const uint8_t scale = mx_encode_block(x, x_code, s, e5m2, codes, 1);
  mx_decode_block(codes, 1, scale, s, e5m2, out);
}

// The number of blocks of a (rows, cols) matrix.
MIXTRAIN_HOST_DEVICE inline int64_t mx_block_count(int64_t rows, int64_t cols, bool down) {
  return down ? ((rows + kMxBlock - 1) / kMxBlock) * cols : rows * ((cols + kMxBlock - 1) / kMxBlock);
}

// cuBLASLt's FP8 GEMM reads both operands with their rows along k (the "TN" layout): codes (rows, k) row-major.
// Element i of those codes comes from element tn_source_index(i, ...) of the operand x: x itself when it lies
// (rows, k), or (transposed) the (k, rows) row-major x read down its columns.
MIXTRAIN_HOST_DEVICE inline int64_t tn_source_index(int64_t i, int64_t rows, int64_t k, bool transposed) {
  return transposed ? (i % k) * rows + i / k : i;
}

}  // namespace mixtrain::ops::shared
