// Softmax and log-softmax over the last axis of a (rows, classes) tensor. Numerically sensitive:
// always computed in float32 (max-subtracted, float32 sums) whatever the input dtype; the result is
// rounded once into the input's dtype.
#pragma once

#include "mixtrain/core/tensor.h"

namespace mixtrain::ops {

Tensor softmax(const Tensor& x);
// dx = y * (dy - sum(dy * y)) per row, from the saved output y.
Tensor softmax_backward(const Tensor& dy, const Tensor& y);

Tensor log_softmax(const Tensor& x);
// dx = dy - softmax(x) * sum(dy) per row, from the saved output y = log_softmax(x).
Tensor log_softmax_backward(const Tensor& dy, const Tensor& y);

}  // namespace mixtrain::ops
