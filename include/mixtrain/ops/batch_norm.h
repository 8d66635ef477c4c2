// Batch normalization over the last axis (channels), forward and backward side by side, as Keras'
// BatchNormalization computes it. x is read as (rows, C) with rows = every other dimension (N, H, W for
// an image batch). All statistics and arithmetic are float32 whatever x's dtype (Keras opts
// normalization out of 16-bit math); gamma, beta and the statistics are float32 (C,) tensors; the
// output is rounded once into x's dtype.
#pragma once

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

struct BatchNormStats {
  Tensor mean;      // (C,) float32
  Tensor variance;  // (C,) float32, biased (divided by rows, as Keras' ops.moments)
};

// Per-channel mean and variance of x over all but the last axis; two float32 passes (the variance sums
// squared deviations from the mean, so a large mean does not cancel it away).
BatchNormStats batch_moments(const Tensor& x);

// y = (x - mean) / sqrt(variance + epsilon) * gamma + beta, with the given statistics (the batch's in
// training, the moving ones in inference); y has x's dtype and shape.
Tensor batch_norm(const Tensor& x, const Tensor& mean, const Tensor& variance, const Tensor& gamma,
                  const Tensor& beta, float epsilon);

struct BatchNormGrads {
  Tensor dx;      // x's shape and dtype (undefined unless asked for)
  Tensor dgamma;  // (C,) float32
  Tensor dbeta;   // (C,) float32
};
// Gradients of batch_norm given dy (any floating dtype, read in float32). batch_statistics: mean and
// variance were x's own batch moments, so the gradient flows through them too (training); otherwise they
// were constants (inference statistics).
BatchNormGrads batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& variance,
                                   const Tensor& gamma, float epsilon, bool batch_statistics, bool need_x);

// Synchronized batch normalization's parts (nn/normalization.h reduces their results over the ranks between calls).
// Per-channel float32 sums over all but the last axis, in batch_moments' block order: of x when `center` is
// undefined, else of (x - center)^2 with center float32 (C,). They are batch_moments' two passes before the
// 1 / rows, so one rank's sums times batch_norm_inv_rows give its moments' bits. An empty x sums to zeros.
Tensor batch_channel_sums(const Tensor& x, const Tensor& center = Tensor());

// batch_norm_backward's dx with batch statistics, but with the given per-channel sums (float32 (C,)) in place of the
// batch's own: sum_dy for sum(dy) and sum_dy_xhat for sum(dy * xhat); mean_dy = sum_dy / rows as there. A
// synchronized layer passes the global batch's sums, weighted into this rank's loss, so dx accounts for how every
// rank's rows moved the global statistics. dx has x's shape and dtype.
Tensor batch_norm_input_grad(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& variance,
                             const Tensor& gamma, float epsilon, const Tensor& sum_dy, const Tensor& sum_dy_xhat);

// Keras' moving statistics after a training batch, decided where they live: when every element of the batch's mean
// and variance is finite, moving = moving * momentum + batch * (1 - momentum) (float32, each product rounded, then
// the sum); otherwise the moving statistics are kept and `skipped` (float32 (1,), a count) grows by one. All five
// tensors float32 on one device, the statistics (C,); returns the new moving mean and variance (copies of the old
// ones after a skip), so a training step on a GPU never reads the batch statistics back.
BatchNormStats update_moving_statistics(const Tensor& moving_mean, const Tensor& moving_variance,
                                        const BatchNormStats& batch, float momentum, Tensor& skipped);

namespace kernel {
// Tensors arrive contiguous and validated (x read as (rows, C)); outputs are preallocated and overwritten.
using BatchMomentsFn = void(const Tensor& x, Tensor& mean, Tensor& variance);
using BatchNormFn = void(const Tensor& x, const Tensor& mean, const Tensor& variance, const Tensor& gamma,
                         const Tensor& beta, float epsilon, Tensor& y);
// dx is undefined when not wanted.
using BatchNormBackwardFn = void(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& variance,
                                 const Tensor& gamma, float epsilon, bool batch_statistics, Tensor& dx,
                                 Tensor& dgamma, Tensor& dbeta);
// sums preallocated (C,) float32; center undefined (sums of x) or (C,) float32.
using BatchChannelSumsFn = void(const Tensor& x, const Tensor& center, Tensor& sums);
using BatchNormInputGradFn = void(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& variance,
                                  const Tensor& gamma, float epsilon, const Tensor& sum_dy, const Tensor& sum_dy_xhat,
                                  Tensor& dx);
// next_* preallocated (C,) float32; skipped float32 (1,), incremented in place on a skip.
using MovingStatisticsFn = void(const Tensor& moving_mean, const Tensor& moving_variance, const Tensor& mean,
                                const Tensor& variance, float momentum, Tensor& next_mean, Tensor& next_variance,
                                Tensor& skipped);
}  // namespace kernel
MIXTRAIN_KERNEL_SIGNATURE(batch_moments, BatchMomentsFn)
MIXTRAIN_KERNEL_SIGNATURE(batch_norm, BatchNormFn)
MIXTRAIN_KERNEL_SIGNATURE(batch_norm_backward, BatchNormBackwardFn)
MIXTRAIN_KERNEL_SIGNATURE(batch_channel_sums, BatchChannelSumsFn)
MIXTRAIN_KERNEL_SIGNATURE(batch_norm_input_grad, BatchNormInputGradFn)
MIXTRAIN_KERNEL_SIGNATURE(moving_statistics, MovingStatisticsFn)

}  // namespace mixtrain::ops
