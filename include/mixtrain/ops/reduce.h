// Sum over one axis, forward and backward side by side (the reduction under pooling over a window axis,
// a batch-norm statistic or an attention row sum). Sums accumulate in float32 in index order (the bits
// do not depend on the thread count) and are rounded once into the output dtype.
#pragma once

#include <optional>

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

// Sum of x (any floating dtype, rank >= 1) over axis (negative counts from the end). The result drops
// that axis, or keeps it with length 1 when keepdims; its dtype is out_dtype, or x's when none is given.
Tensor reduce_sum(const Tensor& x, int axis, bool keepdims = false, std::optional<DType> out_dtype = std::nullopt);
// Gradient of reduce_sum: dy (the result's shape) repeated along axis to x's shape, in x's dtype.
Tensor reduce_sum_backward(const Tensor& dy, const Tensor& x, int axis, bool keepdims = false);

namespace kernel {
// y (outer, inner) = sum over j of x (outer, n, inner)[:, j, :]; x and y are contiguous.
using ReduceSumFn = void(const Tensor& x, int64_t outer, int64_t n, int64_t inner, Tensor& y);
// dx (outer, n, inner)[:, j, :] = dy (outer, inner) for every j.
using ReduceSumBackwardFn = void(const Tensor& dy, int64_t outer, int64_t n, int64_t inner, Tensor& dx);
}  // namespace kernel
MIXTRAIN_KERNEL_SIGNATURE(reduce_sum, ReduceSumFn)
MIXTRAIN_KERNEL_SIGNATURE(reduce_sum_backward, ReduceSumBackwardFn)

}  // namespace mixtrain::ops
