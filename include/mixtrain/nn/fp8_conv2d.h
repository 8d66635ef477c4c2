// Conv2D's convolution under a float8 policy (docs/FP8.md): x and the kernel quantized to the forward format, the
// incoming gradient to the backward format, each with its per-tensor scale from `scales`, as fp8_linear does.
//   x (N, H, W, cin) in the compute dtype; kernel (kh, kw, cin, cout), read from its float32 value; bias (cout,)
//   float32 or undefined -> (N, OH, OW, cout) in x's dtype.
// The quantized values are widened to float32 (exact) for ops::conv2d, which rounds its output into its operands'
// dtype: the sums stay float32 until 1 / (s_x s_w) and the bias are applied, then round once into x's dtype. So the
// convolution runs on the float32 GEMM, not the bfloat16 one (slower; Dense's product is on the bfloat16 path).
// dx and dkernel likewise from the quantized operands, dbias from the unquantized gradient. CPU only.
#pragma once

#include <memory>

#include "mixtrain/autograd/var.h"
#include "mixtrain/ops/conv2d.h"
#include "mixtrain/precision/fp8_gemm_scales.h"

namespace mixtrain {

Var fp8_conv2d(const Var& x, const Var& kernel, const Var& bias, const ops::Conv2dOptions& options,
               const std::shared_ptr<Fp8GemmScales>& scales);

}  // namespace mixtrain
