// Dense's product under a float8 policy (docs/FP8.md): y = x kernel + bias with x and the kernel quantized to the
// forward format, and in the backward pass the incoming gradient quantized to the backward format, each with its own
// per-tensor scale from `scales` (ops/fp8_gemm.h: widened to bfloat16, multiplied on the bfloat16 GEMM with float32
// accumulation, the inverse scales applied before the one rounding).
//   x (..., in) in the compute dtype; kernel (in, units), read from its own (float32) value; bias (units,) float32
//   or undefined -> (..., units) in x's dtype.
//   dx = (g_q kernel_q^T) / (s_g s_w), in x's dtype; dkernel = (x_q^T g_q) / (s_x s_g), float32; dbias = the
//   column sums of the unquantized gradient, in float32.
// The quantized operands are kept for the backward pass as FP8 codes (the block recipe: as bfloat16). CPU only.
#pragma once

#include <memory>
#include <vector>

#include "mixtrain/autograd/var.h"
#include "mixtrain/precision/fp8_gemm_scales.h"

namespace mixtrain {

Var fp8_linear(const Var& x, const Var& kernel, const Var& bias, const std::shared_ptr<Fp8GemmScales>& scales);

// autograd's fused_projection under a float8 policy (the attention projections): the float32 kernels (leading
// dimensions multiplying to x's width) side by side as one (in, sum of widths) kernel, quantized as one tensor with
// `scales`, one FP8 product as fp8_linear; the kernel and bias gradients split back into the variables' shapes.
// biases[i] float32 or undefined.
Var fp8_fused_projection(const Var& x, const std::vector<Var>& kernels, const std::vector<Var>& biases,
                         const std::shared_ptr<Fp8GemmScales>& scales);

// The kernels (float32, each read as (rows, its numel / rows)) side by side in one float32 (rows, sum of widths)
// matrix: the weight fp8_fused_projection quantizes, and what inspect counts as a layer's FP8 weight (Fp8Gemm).
Tensor kernels_side_by_side(const std::vector<Var>& kernels, int64_t rows);

}  // namespace mixtrain
