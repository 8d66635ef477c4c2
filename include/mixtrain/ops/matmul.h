// Matrix products, forward and backward side by side. Inputs share one floating dtype; products
// accumulate in float32 (kernels::gemm's contract) and the result is rounded once into the output dtype.
#pragma once

#include <optional>
#include <vector>

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/dispatch.h"

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
KernelTable<BmmFn>& bmm_table();
}  // namespace kernel

}  // namespace mixtrain::ops
