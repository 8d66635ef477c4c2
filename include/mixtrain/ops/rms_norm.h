// Root-mean-square normalization over the last axis, forward and backward side by side, as Keras'
// RMSNormalization and LLaMA's RMSNorm compute it: each row (every index but the last axis) is divided by the root
// of its mean square, with no mean subtracted and no offset added. Statistics and arithmetic are float32 whatever
// x's dtype (a float16 row's sum of squares overflows past 256 per element); scale and the saved statistic are
// float32; the output is rounded once into x's dtype.
#pragma once

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

struct RmsNormOutput {
  Tensor y;     // x's shape and dtype
  Tensor rstd;  // (rows,) float32: 1 / sqrt(mean(x^2) + epsilon)
};

// y = x * rstd * scale over the last axis of x (..., D); scale float32 (D,). One float32 pass per row for the
// sum of squares (in the lanes' order of shared/lane_sum.h).
RmsNormOutput rms_norm(const Tensor& x, const Tensor& scale, float epsilon);

struct RmsNormGrads {
  Tensor dx;      // x's shape and dtype (undefined unless asked for)
  Tensor dscale;  // (D,) float32: sum over rows of dy * xhat, xhat = x * rstd
};
// Gradients of rms_norm given dy (x's shape, any floating dtype, read in float32) and the saved rstd:
// dx = rstd * (g - xhat * mean(g * xhat)) per row with g = dy * scale, computed in float32 and rounded once. The
// column sums go through fixed blocks of rows added in block order.
RmsNormGrads rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& rstd, const Tensor& scale,
                               bool need_x);

namespace kernel {
// x is read as (rows, D), contiguous; outputs preallocated and overwritten.
using RmsNormFn = void(const Tensor& x, const Tensor& scale, float epsilon, Tensor& y, Tensor& rstd);
// dx is undefined when not wanted.
using RmsNormBackwardFn = void(const Tensor& dy, const Tensor& x, const Tensor& rstd, const Tensor& scale,
                               Tensor& dx, Tensor& dscale);
}  // namespace kernel
MIXTRAIN_KERNEL_SIGNATURE(rms_norm, RmsNormFn)
MIXTRAIN_KERNEL_SIGNATURE(rms_norm_backward, RmsNormBackwardFn)

}  // namespace mixtrain::ops
