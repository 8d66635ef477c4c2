// Softmax and log-softmax over the last axis of a tensor of any rank (every other axis indexes rows).
// Numerically sensitive: always computed in float32 (max-subtracted, float32 sums) whatever the input
// dtype; the result is rounded once into the input's dtype.
#pragma once

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

Tensor softmax(const Tensor& x);
// dx = y * (dy - sum(dy * y)) per row, from the saved output y; dx has y's dtype.
Tensor softmax_backward(const Tensor& dy, const Tensor& y);

Tensor log_softmax(const Tensor& x);
// dx = dy - softmax(x) * sum(dy) per row, from the saved output y = log_softmax(x); dx has y's dtype.
Tensor log_softmax_backward(const Tensor& dy, const Tensor& y);

namespace kernel {
// y = softmax(x) (log_softmax when log) over rows of x.dim(-1) elements; y has x's shape and dtype.
using SoftmaxFn = void(const Tensor& x, bool log, Tensor& y);
// dx from the saved output y (of softmax, or of log_softmax when log) and dy; dx has y's shape and dtype.
using SoftmaxBackwardFn = void(const Tensor& dy, const Tensor& y, bool log, Tensor& dx);
}  // namespace kernel
MIXTRAIN_KERNEL_SIGNATURE(softmax, SoftmaxFn)
MIXTRAIN_KERNEL_SIGNATURE(softmax_backward, SoftmaxBackwardFn)

}  // namespace mixtrain::ops
