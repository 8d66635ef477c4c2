// Pooling over NHWC images, forward and backward side by side, as Keras' pooling layers compute them.
// Values are read in float32 and each output is rounded once into the input's dtype (a max is exact in
// any dtype; an average is summed in float32).
#pragma once

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/conv2d.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

struct Pool2dOptions {
  Size2 pool_size = 2;
  Size2 strides = 2;  // Keras' default strides are the pool size
  Padding padding = Padding::kValid;
};

// (N, H, W, C) -> (N, OH, OW, C): the largest value of each window. With "same" padding the padded
// positions never win (they are not values). NaN in a window propagates.
Tensor max_pool2d(const Tensor& x, const Pool2dOptions& options);
// dx: each window's gradient goes to the first position holding its maximum (recomputed from x, so the
// forward pass keeps nothing extra); x's dtype, each element summed in float32 and rounded once. NaNs
// are skipped in that search (a window whose output is NaN sends its gradient to its largest number, or
// to its first position when it holds no number).
Tensor max_pool2d_backward(const Tensor& dy, const Tensor& x, const Pool2dOptions& options);

// (N, H, W, C) -> (N, OH, OW, C): the mean of each window over the positions inside the image (with
// "same" padding, padded positions are not counted, as TensorFlow).
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& options);
// dx: each window's gradient shared equally among the positions it averaged; x_shape and x's dtype.
Tensor avg_pool2d_backward(const Tensor& dy, const Shape& x_shape, DType x_dtype, const Pool2dOptions& options);

// (N, H, W, C) -> (N, C): the mean over H and W, summed in float32.
Tensor global_average_pool2d(const Tensor& x);
// dx (N, H, W, C) = dy (N, C) / (H * W) broadcast, in x_dtype.
Tensor global_average_pool2d_backward(const Tensor& dy, const Shape& x_shape, DType x_dtype);

// Output shape of max_pool2d / avg_pool2d, for layers' compute_output_shape.
Shape pool2d_output_shape(const Shape& x_shape, const Pool2dOptions& options);

enum class PoolKind { kMax, kAverage };

namespace kernel {
// Tensors arrive contiguous and validated; outputs are preallocated and overwritten. For max pooling's
// backward, x is the forward input; average pooling's backward leaves x undefined.
using Pool2dFn = void(const Tensor& x, PoolKind kind, const Window2d& g, Tensor& y);
using Pool2dBackwardFn = void(const Tensor& dy, const Tensor& x, PoolKind kind, const Window2d& g, Tensor& dx);
// x (N, H, W, C) -> y (N, C); backward dy (N, C) -> dx (N, H, W, C).
using GlobalAveragePool2dFn = void(const Tensor& x, Tensor& y);
using GlobalAveragePool2dBackwardFn = void(const Tensor& dy, Tensor& dx);
}  // namespace kernel
MIXTRAIN_KERNEL_SIGNATURE(pool2d, Pool2dFn)
MIXTRAIN_KERNEL_SIGNATURE(pool2d_backward, Pool2dBackwardFn)
MIXTRAIN_KERNEL_SIGNATURE(global_average_pool2d, GlobalAveragePool2dFn)
MIXTRAIN_KERNEL_SIGNATURE(global_average_pool2d_backward, GlobalAveragePool2dBackwardFn)

}  // namespace mixtrain::ops
