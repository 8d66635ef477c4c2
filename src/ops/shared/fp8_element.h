// The element steps of FP8 quantization (ops/fp8_gemm.h) and of the float8 casts, written once for the CPU and the
// GPU: core/float8.h's conversions (host-and-device code) composed into what one element of each kernel computes.
// The CPU kernels reach the same bits through core's array conversions; tests/ops/cuda_fp8_shared_test.cpp holds
// these steps to the CPU ops on every code, so the GPU kernels built on them give the CPU's bits.
#pragma once

#include <cstdint>

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

// cuBLASLt's FP8 GEMM reads both operands with their rows along k (the "TN" layout): codes (rows, k) row-major.
// Element i of those codes comes from element tn_source_index(i, ...) of the operand x: x itself when it lies
// (rows, k), or (transposed) the (k, rows) row-major x read down its columns.
MIXTRAIN_HOST_DEVICE inline int64_t tn_source_index(int64_t i, int64_t rows, int64_t k, bool transposed) {
  return transposed ? (i % k) * rows + i / k : i;
}

}  // namespace mixtrain::ops::shared
