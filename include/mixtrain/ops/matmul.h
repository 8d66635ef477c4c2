// Matrix products, forward and backward side by side. Inputs share one floating dtype; products
// accumulate in float32 (the kernels' contract) and the result is rounded once into the output dtype.
#pragma once

#include <optional>

#include "mixtrain/core/tensor.h"

namespace mixtrain::ops {

// op(a) (m, k) x op(b) (k, n) -> (m, n); op transposes when trans_* is set.
// The result has out_dtype, or a's dtype when none is given.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false,
              std::optional<DType> out_dtype = std::nullopt);

struct MatmulGrads {
  Tensor da;  // shape and dtype of a (unless grad_dtype overrides the dtype)
  Tensor db;  // shape and dtype of b
};
// Gradients of c = op(a) op(b) given dc; need_a / need_b skip work that no one reads.
MatmulGrads matmul_backward(const Tensor& dc, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                            bool need_a, bool need_b);

// Dense layer product: x (B, in) x w (in, out) + bias (out,) float32 -> (B, out) in x's dtype.
// w must already be in x's dtype (the layer casts its float32 variable once per update).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias);

struct LinearGrads {
  Tensor dx;     // (B, in), dtype of x
  Tensor dw;     // (in, out), float32: written straight into the variable's dtype, no 16-bit rounding
  Tensor dbias;  // (out,), float32; summed in float32
};
LinearGrads linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, bool need_x, bool need_bias);

}  // namespace mixtrain::ops
