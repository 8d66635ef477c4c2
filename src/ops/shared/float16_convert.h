// float32 <-> float16 / bfloat16 as bit patterns, for the GPU's casts: core/half.h's rule (round to nearest, ties
// to even; subnormals kept; infinities kept; NaN stays a quiet NaN with its payload's top bits), compiled for the
// device too. The hardware conversions (cvt.rn.f16.f32) agree on numbers but not on NaN payloads, so the GPU uses
// these and a tensor cast on either device has the same bits.
#pragma once

#include <cstdint>

#include "host_device.h"
#include "mixtrain/core/dtype.h"
#include "mixtrain/core/half.h"

namespace mixtrain::ops::shared {

// core/half.h's conversions, which device code calls too (MIXTRAIN_HOST_DEVICE): one rule, one set of tests
// (tests/core/half_test.cpp).
MIXTRAIN_HOST_DEVICE inline float half_to_float(uint16_t h) { return half_bits_to_float(h); }
MIXTRAIN_HOST_DEVICE inline uint16_t float_to_half(float f) { return float_to_half_bits(f); }
MIXTRAIN_HOST_DEVICE inline float bfloat16_to_float(uint16_t b) { return bf16_bits_to_float(b); }
MIXTRAIN_HOST_DEVICE inline uint16_t float_to_bfloat16(float f) { return float_to_bf16_bits(f); }

// The storage dtypes the GPU kernels convert between, as a plain kernel argument (device code reads no traits
// table). Host code gets one from float_code().
enum FloatCode : int { kCodeFloat32 = 0, kCodeFloat16 = 1, kCodeBFloat16 = 2 };

// Host only: the code of a floating dtype (callers have checked is_float).
inline int float_code(DType dt) {
  return dt == DType::kFloat16 ? kCodeFloat16 : dt == DType::kBFloat16 ? kCodeBFloat16 : kCodeFloat32;
}

// Element i of a float32 / float16 / bfloat16 array, widened to float32 (exact).
MIXTRAIN_HOST_DEVICE inline float load_as_float(const void* p, int code, int64_t i) {
  if (code == kCodeFloat16) return half_to_float(static_cast<const uint16_t*>(p)[i]);
  if (code == kCodeBFloat16) return bfloat16_to_float(static_cast<const uint16_t*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

// Rounds v once into element i of a float32 / float16 / bfloat16 array.
MIXTRAIN_HOST_DEVICE inline void store_from_float(void* p, int code, int64_t i, float v) {
  if (code == kCodeFloat16)
    static_cast<uint16_t*>(p)[i] = float_to_half(v);
  else if (code == kCodeBFloat16)
    static_cast<uint16_t*>(p)[i] = float_to_bfloat16(v);
  else
    static_cast<float*>(p)[i] = v;
}

// v rounded once into the dtype of `code` and widened back: what an element of that dtype holds of v (e.g. a logit
// as a 16-bit GEMM output holds it).
MIXTRAIN_HOST_DEVICE inline float through_dtype(float v, int code) {
  if (code == kCodeFloat16) return half_to_float(float_to_half(v));
  if (code == kCodeBFloat16) return bfloat16_to_float(float_to_bfloat16(v));
  return v;
}

// Elements base, base + 1, ... of a float32 / float16 / bfloat16 array as float32: view[j] reads element base + j.
// The row functions of this folder take any row type with operator[] returning float, so a CPU kernel passes its
// float32 row buffer and a GPU kernel passes one of these over the tensor's own storage.
struct FloatView {
  const void* p;
  int code;
  int64_t base;
  MIXTRAIN_HOST_DEVICE float operator[](int64_t j) const { return load_as_float(p, code, base + j); }
};

}  // namespace mixtrain::ops::shared
