// The pieces of an FP8 GEMM on the CPU (docs/FP8.md). An operand is quantized to a float8 format with a per-tensor
// scale and widened exactly to bfloat16 (every float8_e4m3fn and float8_e5m2 value is a bfloat16 value), so the
// product runs on the bfloat16 GEMM (AMX, vdpbf16ps or widening) with float32 accumulation; the inverse scales are
// applied to the float32 accumulator in the GEMM's epilogue, before the one rounding into the output's dtype.
// On CUDA too: scaled_matmul runs on cuBLASLt's FP8 GEMM where the operands and the GPU allow it
// (src/ops/cuda/fp8_gemm_route.h).
#pragma once

#include <optional>

#include "mixtrain/core/float8.h"
#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

// The largest magnitude of x's elements (float32, float16 or bfloat16), read back to the host; NaN when any element
// is NaN, 0 for an empty tensor.
float fp8_amax(const Tensor& x);

struct Fp8Operand {
  Tensor values;  // bfloat16, x's shape: the value of the float8 code of x * scale (exact in bfloat16)
  float amax;     // fp8_amax(x), taken in the same pass (before scaling)
};
// Each element of x (float32, float16 or bfloat16) times scale, rounded to float32, then to `format`
// (float8_e4m3fn or float8_e5m2) to nearest even, then widened to bfloat16. Overflow as `overflow` says, by default
// the format's (E4M3 saturates to 448, E5M2 overflows to infinity, as core/float8.h and Tensor::to cast); kSaturate
// is what the FP8 layers use for both formats, as Transformer Engine's casts (CUDA's __NV_SATFINITE). scale must be
// finite and positive. The values read as x when divided by scale. `into`, when defined (bfloat16, x's shape,
// contiguous; x itself may be given), receives the values instead of a new tensor.
Fp8Operand fp8_quantize(const Tensor& x, DType format, float scale,
                        std::optional<Float8Overflow> overflow = std::nullopt, const Tensor& into = Tensor());

// x (rows, cols) (float32, float16 or bfloat16) in MXFP8, as precision/mx_block_scaling.h defines it: blocks of 32
// consecutive elements along each row (along_columns false) or down each column, each with the scale 2^k, k the
// smallest (at least -127) with the block's amax <= format max * 2^k, the elements the codes of x / 2^k in `format`
// (float8_e4m3fn or float8_e5m2; nearest even, nothing saturates). Returned as the bfloat16 values code * 2^k, the
// block scales applied as the codes widen: a GEMM of two such operands needs no scale in its epilogue. The widening
// is exact while code * 2^k stays inside bfloat16's normal range (magnitudes 2^-126 to 2^128); a block's tiny
// elements below it round (and a bfloat16 GEMM may read them as zero), an amax within 2^-3 of float32's largest can
// round up to infinity. A block holding NaN or infinity reads back as NaN. Kept by the block recipe. `into` as for
// fp8_quantize (x itself may be given).
Tensor mx_block_quantize(const Tensor& x, DType format, bool along_columns, const Tensor& into = Tensor());

// MXFP8 as it is stored: the codes of x / 2^k in `format` ((rows, cols)) and each block's scale 2^k as a
// float8_e8m0fnu (k + 127; 0xFF, NaN, for a block that held NaN or an infinity), row-major in block order: (rows,
// ceil(cols / 32)) for blocks along the rows, (ceil(rows / 32), cols) down the columns. One byte an element and one
// a block, where mx_block_quantize's values take two an element: what the block recipe keeps for backward.
struct MxBlockCodes {
  Tensor codes;   // (rows, cols), float8_e4m3fn or float8_e5m2
  Tensor scales;  // float8_e8m0fnu, one per block
  bool along_columns = false;
};
// x (rows, cols) (float32, float16 or bfloat16) encoded as mx_block_quantize quantizes it.
MxBlockCodes mx_block_encode(const Tensor& x, DType format, bool along_columns);
// The bfloat16 values code * 2^k of q: mx_block_quantize(x) bit for bit for q = mx_block_encode(x). q's codes and
// scales may be column slices of a larger pair (blocks down the columns); `into` as for mx_block_quantize.
Tensor mx_block_decode(const MxBlockCodes& q, const Tensor& into = Tensor());

// c (m, n) = alpha * op(a) op(b) + bias, op transposing when trans_* is set: a (m, k) or (k, m), b (k, n) or (n, k),
// both 2-D, contiguous, one floating dtype. Products accumulate in float32; alpha multiplies the float32
// accumulator, then the float32 bias (n,) (may be undefined) is added, then the result is rounded once into
// out_dtype. c_into, when defined (contiguous, (m, n), out_dtype), receives c and is returned.
Tensor scaled_matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, float alpha, const Tensor& bias,
                     DType out_dtype, const Tensor& c_into = Tensor());

namespace kernel {
// amax (float32, (1,)) = the largest magnitude of contiguous x, NaN winning.
using Fp8AmaxFn = void(const Tensor& x, Tensor& amax);
// values (bfloat16, x's shape, contiguous) as fp8_quantize; amax (float32, (1,)) as Fp8AmaxFn.
using Fp8QuantizeFn = void(const Tensor& x, DType format, float scale, Float8Overflow overflow, Tensor& values,
                           Tensor& amax);
// values (bfloat16, (rows, cols), contiguous) = mx_block_quantize(x) for contiguous 2-D x.
using MxBlockQuantizeFn = void(const Tensor& x, DType format, bool along_columns, Tensor& values);
// codes (x's shape) and scales (one per block, block order), contiguous, = mx_block_encode(x) for contiguous 2-D x.
using MxBlockEncodeFn = void(const Tensor& x, DType format, bool along_columns, Tensor& codes, Tensor& scales);
// values (bfloat16, codes' shape, contiguous) = mx_block_decode of contiguous codes and scales.
using MxBlockDecodeFn = void(const Tensor& codes, const Tensor& scales, bool along_columns, Tensor& values);
struct ScaledMatmulLayout {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
};
// c (m, n), contiguous, = alpha * op(a) op(b) + bias as scaled_matmul; bias float32 (n,) or undefined.
using ScaledMatmulFn = void(const Tensor& a, const Tensor& b, const Tensor& bias, const ScaledMatmulLayout& layout,
                            float alpha, Tensor& c);
}  // namespace kernel
MIXTRAIN_KERNEL_SIGNATURE(fp8_amax, Fp8AmaxFn)
MIXTRAIN_KERNEL_SIGNATURE(fp8_quantize, Fp8QuantizeFn)
MIXTRAIN_KERNEL_SIGNATURE(mx_block_quantize, MxBlockQuantizeFn)
MIXTRAIN_KERNEL_SIGNATURE(mx_block_encode, MxBlockEncodeFn)
MIXTRAIN_KERNEL_SIGNATURE(mx_block_decode, MxBlockDecodeFn)
MIXTRAIN_KERNEL_SIGNATURE(scaled_matmul, ScaledMatmulFn)

}  // namespace mixtrain::ops
