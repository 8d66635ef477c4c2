// The GPU's own GEMM (cuda/gemm_fallback.cu), element by element: where operands sit in a BmmLayout's memory, how
// a C element's terms are added, and how the float32 bias finishes it. Written once for the kernel and for
// the host, where tests rebuild the kernel's bits (tests/ops/cuda_gemm_fallback_test.cpp).
//
// C[i][j] = sum over t in [0, k) of op(A)[i][t] op(B)[t][j]: float32 from +0, terms in t order, each added with
// one fused multiply-add (one rounding per term), then times alpha (cuBLASLt's alpha, 1 but for attention's
// scores), then + bias[j], then one rounding into C's dtype. The kernel's tiles change which thread holds a term,
// not this order.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace mixtrain::ops::shared {

// Offset of op(A)[i][t] from A's first element: A is row-major (m, k) with row stride lda, or (k, m) when trans_a.
MIXTRAIN_HOST_DEVICE inline int64_t gemm_a_offset(bool trans_a, int64_t lda, int64_t i, int64_t t) {
  return trans_a ? t * lda + i : i * lda + t;
}

// Offset of op(B)[t][j] from B's first element: B is row-major (k, n) with row stride ldb, or (n, k) when trans_b.
MIXTRAIN_HOST_DEVICE inline int64_t gemm_b_offset(bool trans_b, int64_t ldb, int64_t t, int64_t j) {
  return trans_b ? j * ldb + t : t * ldb + j;
}

// One more term of a C element.
MIXTRAIN_HOST_DEVICE inline float gemm_accumulate(float acc, float a, float b) { return fma_rn(a, b, acc); }

// The finished float32 element: alpha * acc (one float32 rounding, as cuBLASLt's epilogue scales the float32 sum;
// times 1 is exact), + bias[j] (bias may be null).
MIXTRAIN_HOST_DEVICE inline float gemm_finish(float acc, float alpha, const float* bias, int64_t j) {
  const float scaled = mul_rn(alpha, acc);
  return bias != nullptr ? add_rn(scaled, bias[j]) : scaled;
}

}  // namespace mixtrain::ops::shared
