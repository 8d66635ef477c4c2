// Layer normalization over the last axis, forward and backward side by side, as Keras'
// LayerNormalization computes it. Each row (every index but the last axis) is normalized by its own mean
// and variance. Statistics and arithmetic are float32 whatever x's dtype (a float16 row with a large mean
// would lose its spread to cancellation, and its sum of squares could overflow); gamma, beta and the saved
// statistics are float32; the output is rounded once into x's dtype.
#pragma once

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

struct LayerNormOutput {
  Tensor y;     // x's shape and dtype
  Tensor mean;  // (rows,) float32: each row's mean
  Tensor rstd;  // (rows,) float32: 1 / sqrt(variance + epsilon), variance biased (divided by the row length)
};

// y = (x - mean) * rstd * gamma + beta over the last axis of x (..., D); gamma and beta float32 (D,).
// Two float32 passes per row (the variance sums squared deviations from the mean, so a large mean does not
// cancel it away).
LayerNormOutput layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float epsilon);

struct LayerNormGrads {
  Tensor dx;      // x's shape and dtype (undefined unless asked for)
  Tensor dgamma;  // (D,) float32: sum over rows of dy * xhat
  Tensor dbeta;   // (D,) float32: sum over rows of dy
};
// Gradients of layer_norm given dy (x's shape, any floating dtype, read in float32) and the saved mean and
// rstd: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) per row with g = dy * gamma, computed in float32
// and rounded once. The column sums go through fixed blocks of rows added in block order.
LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& gamma, bool need_x);

namespace kernel {
// x is read as (rows, D), contiguous; outputs preallocated and overwritten.
using LayerNormFn = void(const Tensor& x, const Tensor& gamma, const Tensor& beta, float epsilon, Tensor& y,
                         Tensor& mean, Tensor& rstd);
// dx is undefined when not wanted.
using LayerNormBackwardFn = void(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                 const Tensor& gamma, Tensor& dx, Tensor& dgamma, Tensor& dbeta);
}  // namespace kernel
MIXTRAIN_KERNEL_SIGNATURE(layer_norm, LayerNormFn)
MIXTRAIN_KERNEL_SIGNATURE(layer_norm_backward, LayerNormBackwardFn)

}  // namespace mixtrain::ops
