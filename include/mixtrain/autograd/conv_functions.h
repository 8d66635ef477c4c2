// Differentiable convolution, pooling and normalization on NHWC Vars. Each runs the forward op from
// mixtrain::ops and, when recording, tapes the matching backward op (ops/conv2d.h, ops/pooling.h,
// ops/batch_norm.h say what each computes and accumulates in).
#pragma once

#include "mixtrain/autograd/tape.h"
#include "mixtrain/ops/batch_norm.h"
#include "mixtrain/ops/conv2d.h"
#include "mixtrain/ops/pooling.h"

namespace mixtrain {

// x (N, H, W, cin) convolved with kernel (kh, kw, cin, cout) plus bias (cout,). kernel_compute is the
// kernel read in x's dtype (a cached cast of the variable `kernel`); the kernel's gradient is computed
// in float32 and added straight to `kernel`, as linear() does. bias is float32 or undefined.
Var conv2d(const Var& x, const Var& kernel, const Tensor& kernel_compute, const Var& bias,
           const ops::Conv2dOptions& options);

Var max_pool2d(const Var& x, const ops::Pool2dOptions& options);
Var avg_pool2d(const Var& x, const ops::Pool2dOptions& options);
// (N, H, W, C) -> (N, C).
Var global_average_pool2d(const Var& x);

struct BatchNormOutput {
  Var y;              // x's shape and dtype
  ops::BatchNormStats batch;  // the batch's float32 moments (training only; undefined in inference)
};
// Normalizes x over all but its last axis. training: with the batch's own moments, which the result
// returns so that the layer can update its moving statistics (the tape never does); the gradient flows
// through the moments. Otherwise: with moving_mean and moving_variance as constants. gamma and beta are
// float32 Vars (C,); the statistics float32 (C,) tensors.
BatchNormOutput batch_norm(const Var& x, const Var& gamma, const Var& beta, const Tensor& moving_mean,
                           const Tensor& moving_variance, float epsilon, bool training);

}  // namespace mixtrain
