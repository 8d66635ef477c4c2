// Matrix products, forward and backward side by side. Inputs share one floating dtype; products
// accumulate in float32 (kernels::gemm's contract) and the result is rounded once into the output dtype.
#pragma once

#include <optional>
#include <vector>

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

// Batched product: op(a) (..., m, k) x op(b) (..., k, n) -> (..., m, n); op transposes the last two
// dimensions when trans_* is set. The batch dimensions (all but the last two) broadcast as in NumPy
// (equal, or 1, or missing on one side). The result has out_dtype, or a's dtype when none is given.
// Views whose last two dimensions are a row-major matrix or its transpose (x.transpose(-2, -1)) are read
// in place, with any batch strides; other views are copied to contiguous memory first.
Tensor bmm(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false,
           std::optional<DType> out_dtype = std::nullopt);

struct MatmulGrads {
  Tensor da;  // shape and dtype of a
  Tensor db;  // shape and dtype of b
};
using BmmGrads = MatmulGrads;
// Gradients of c = bmm(a, b, trans_a, trans_b) given dc (c's shape); need_a / need_b skip work that no one
// reads. A gradient of a broadcast operand is summed over the batch dimensions it was broadcast along
// (in float32, rounded once into the operand's dtype).
BmmGrads bmm_backward(const Tensor& dc, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, bool need_a,
                      bool need_b);

// op(a) (m, k) x op(b) (k, n) -> (m, n), or the batched product of bmm for inputs of higher rank.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false,
              std::optional<DType> out_dtype = std::nullopt);
MatmulGrads matmul_backward(const Tensor& dc, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                            bool need_a, bool need_b);

// Dense layer product: x (..., in) x w (in, out) + bias (out,) float32 -> (..., out) in x's dtype; the
// leading dimensions of x are flattened into one GEMM. w must already be in x's dtype (the layer casts its
// float32 variable once per update); bias may be undefined.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias);

struct LinearGrads {
  Tensor dx;     // (..., in), dtype of x
  Tensor dw;     // (in, out), float32: written straight into the variable's dtype, no 16-bit rounding
  Tensor dbias;  // (out,), float32; summed in float32
};
// dw_into, when defined (float32 (in, out), contiguous: a variable's gradient buffer), receives dw in place and
// g.dw is that tensor, saving a copy of the largest gradient of a Dense layer.
LinearGrads linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, bool need_x, bool need_bias,
                            const Tensor& dw_into = Tensor());

// A Dense layer's product and activation: y = activation(linear(x, w, bias), act), bit for bit. On the CPU, relu
// and gelu are applied inside the GEMM (kernels::gemm_with_post_op) to each block of the product as it is
// finished, while it is still in cache, by the code of the activation kernel, rather than in a second pass over
// the output in memory; the block's values are the ones linear() would return, so the bits do not change. On a GPU
// relu runs in cuBLASLt's epilogue, before the rounding (the same values but for -0 coming out +0, and a NaN from a
// non-finite input possibly 0: docs/ARCHITECTURE.md); gelu as the product then the activation. Other activations,
// and devices without the fused kernel, run linear() then activation().
struct LinearActivation {
  Tensor y;               // (..., out), x's dtype
  Tensor pre_activation;  // linear(x, w, bias) when keep_pre_activation, else undefined
};
LinearActivation linear_activation(const Tensor& x, const Tensor& w, const Tensor& bias, Activation act,
                                   bool keep_pre_activation);
// Gradients of linear_activation: linear_backward(activation_backward(dy, pre_activation, y, act), ...), bit
// for bit. pre_activation is needed for gelu only (may be undefined otherwise): relu's derivative is read from y,
// which is > 0 exactly where the pre-activation is (relu passes NaN, -0 and +0 through unchanged and sends
// every negative value to +0), and sigmoid's and tanh's from y anyway.
LinearGrads linear_activation_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& y,
                                       const Tensor& pre_activation, Activation act, bool need_x, bool need_bias,
                                       const Tensor& dw_into = Tensor());

namespace kernel {
// A batch of products C[p] (m, n) = op(A[p]) op(B[p]) [+ bias], read from strided memory. A[p] starts at
// a.raw() + (sum over d of index_d(p) * a_batch_strides[d]) elements, and likewise B[p]; stored as
// kernels::gemm expects ((m, k) with row stride lda, or (k, m) when trans_a; B likewise).
struct BmmLayout {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0;
  std::vector<int64_t> batch;            // batch shape of C (empty: one product)
  std::vector<int64_t> a_batch_strides;  // per batch dimension, in elements; 0 where A is broadcast
  std::vector<int64_t> b_batch_strides;
};
// a and b may be views (only raw() and the layout locate their elements); c is contiguous (batch..., m, n);
// bias is float32 (n,) or undefined.
using BmmFn = void(const Tensor& a, const Tensor& b, const Tensor& bias, const BmmLayout& layout, Tensor& c);
// y (m, n) = act(op(a) op(b) + bias) for act relu or gelu: one product (layout.batch empty) read as bmm reads
// it. pre, when defined, receives the product before the activation. y and pre are contiguous, in a's dtype.
// A device without this kernel runs the product and the activation as two ops.
using LinearActivationFn = void(const Tensor& a, const Tensor& b, const Tensor& bias, const BmmLayout& layout,
                                Activation act, Tensor& y, Tensor& pre);
}  // namespace kernel
MIXTRAIN_KERNEL_SIGNATURE(bmm, BmmFn)
MIXTRAIN_KERNEL_SIGNATURE(linear_activation, LinearActivationFn)

}  // namespace mixtrain::ops
