// The element-wise product of two tensors of one shape (what a gated layer needs: GLU, SwiGLU, Keras' Multiply),
// computed in float32 whatever the dtypes and rounded once into the output's dtype. Its gradient with respect to
// either operand is the same product: d a = dy * b, d b = dy * a. Any rank; views are read through a contiguous
// copy.
#pragma once

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

// y = a * b; a and b floating, one shape and one dtype; y has their dtype.
Tensor multiply(const Tensor& a, const Tensor& b);
// The gradient of the operand paired with `other`: dy * other, in other's dtype (the operands share one dtype);
// dy of any floating dtype, other's shape.
Tensor multiply_backward(const Tensor& dy, const Tensor& other);

namespace kernel {
// y = a * b element by element; all contiguous with one shape, a and b of any floating dtypes, y of any floating
// dtype.
using MultiplyFn = void(const Tensor& a, const Tensor& b, Tensor& y);
}  // namespace kernel
MIXTRAIN_KERNEL_SIGNATURE(multiply, MultiplyFn)

}  // namespace mixtrain::ops
