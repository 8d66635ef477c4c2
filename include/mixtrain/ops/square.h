// The element-wise square and its gradient: y = x * x and dx = dy * (2 x), computed in float32 whatever the dtype
// and rounded once into the output's dtype (a float16 square overflows to inf past 256, as x * x does in float16
// arithmetic). Any rank; views are read through a contiguous copy.
#pragma once

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

// y = x * x, in x's dtype.
Tensor square(const Tensor& x);
// dx = dy * (2 x) from the saved input x and the output's gradient dy (x's shape); dx has x's dtype.
Tensor square_backward(const Tensor& dy, const Tensor& x);

namespace kernel {
// y = x * x element by element; x and y contiguous, same shape and dtype.
using SquareFn = void(const Tensor& x, Tensor& y);
// dx = dy * (2 x); all contiguous with x's shape, dy of any floating dtype, dx of x's dtype.
using SquareBackwardFn = void(const Tensor& dy, const Tensor& x, Tensor& dx);
}  // namespace kernel
MIXTRAIN_KERNEL_SIGNATURE(square, SquareFn)
MIXTRAIN_KERNEL_SIGNATURE(square_backward, SquareBackwardFn)

}  // namespace mixtrain::ops
