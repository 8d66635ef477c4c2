// 2-D convolution over NHWC images, forward and backward side by side, as Keras' Conv2D computes it.
// The product runs through kernels::gemm: the patches of the whole batch are unfolded (im2col) into one
// buffer in the compute dtype, in a few large chunks when the batch is big, and multiplied by the kernel
// in one GEMM per chunk with float32 accumulation; the bias is added to the float32 sum and the output
// is rounded once.
#pragma once

#include <optional>
#include <string_view>

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

// A height and width (kernel size, pool size, strides). Converts from one integer as Keras accepts.
struct Size2 {
  int64_t h = 1, w = 1;
  Size2() = default;
  Size2(int64_t s) : h(s), w(s) {}  // NOLINT: implicit, as `kernel_size=3` in Keras
  Size2(int64_t h_, int64_t w_) : h(h_), w(w_) {}
  bool operator==(const Size2& o) const { return h == o.h && w == o.w; }
};

// "valid": no padding, windows that do not fit are dropped. "same": zero padding so that the output has
// ceil(input / stride) positions, the extra row or column of padding at the bottom / right (as TensorFlow).
enum class Padding { kValid, kSame };
// "valid" or "same" (case-sensitive, as Keras); Error naming both otherwise.
Padding parse_padding(std::string_view name);
const char* padding_name(Padding p);

// Where a window (kernel or pool) falls on one spatial axis.
struct Axis {
  int64_t in = 0, out = 0, window = 1, stride = 1, pad_before = 0;
};
// Output length and leading padding of one axis, as TensorFlow: valid: (in - window) / stride + 1
// (0 when the window does not fit); same: ceil(in / stride) with pad_total = max((out - 1) * stride +
// window - in, 0) and pad_before = pad_total / 2. Error on a non-positive window or stride.
Axis window_axis(int64_t in, int64_t window, int64_t stride, Padding padding, const char* op);

// The geometry of a windowed NHWC op: batch, channels and both spatial axes.
struct Window2d {
  int64_t batch = 0, channels = 0;
  Axis h, w;
};
Window2d window_2d(const Shape& x_shape, Size2 window, Size2 strides, Padding padding, const char* op);

struct Conv2dOptions {
  Size2 strides = 1;
  Padding padding = Padding::kValid;
};

// y (N, OH, OW, cout) = conv(x (N, H, W, cin), kernel (kh, kw, cin, cout)) + bias (cout,).
// x and kernel share a floating dtype (the compute dtype: the layer reads its float32 kernel in it);
// bias is float32 or undefined. y has x's dtype, or y_dtype when given: x's or float32 (the float32 sums of a 16-bit
// product). alpha scales the float32 sums before the bias is added (each operation rounded to float32, then y rounded
// once): FP8's Conv2D divides its operands' scales out that way, before anything is rounded into 16 bits.
Tensor conv2d(const Tensor& x, const Tensor& kernel, const Tensor& bias, const Conv2dOptions& options,
              std::optional<DType> y_dtype = std::nullopt, float alpha = 1.0f);

struct Conv2dGrads {
  Tensor dx;      // (N, H, W, cin), x's dtype; each element summed in float32 and rounded once
  Tensor dkernel; // (kh, kw, cin, cout), float32: goes straight into the float32 variable, as linear's dw
  Tensor dbias;   // (cout,), float32 sums
};
// Gradients of conv2d given dy (N, OH, OW, cout, any floating dtype: converted to x's dtype first, as
// linear_backward does). need_* skip work no one reads; dkernel is always computed. dx has x's dtype, or dx_dtype
// when given (x's or float32, as conv2d's y_dtype), and is dx_alpha times its float32 sums, rounded once (conv2d's
// alpha: FP8's Conv2D divides its scales out of dx that way).
Conv2dGrads conv2d_backward(const Tensor& dy, const Tensor& x, const Tensor& kernel, const Conv2dOptions& options,
                            bool need_x, bool need_bias, std::optional<DType> dx_dtype = std::nullopt,
                            float dx_alpha = 1.0f);

// Output shape (N, OH, OW, cout) of conv2d, for layers' compute_output_shape (batch may be any value).
Shape conv2d_output_shape(const Shape& x_shape, const Shape& kernel_shape, const Conv2dOptions& options);

namespace kernel {
// Tensors arrive contiguous and validated; outputs are preallocated. bias may be undefined.
// y (x's dtype or float32) = alpha * the float32 sums + bias, rounded once.
using Conv2dFn = void(const Tensor& x, const Tensor& kernel, const Tensor& bias, const Window2d& g, float alpha,
                      Tensor& y);
// dy is in x's dtype. dx (when defined, x's dtype or float32) gets x's gradient times dx_alpha, dkernel (float32)
// the kernel's, dbias (when defined, float32) the bias's; all are overwritten.
using Conv2dBackwardFn = void(const Tensor& dy, const Tensor& x, const Tensor& kernel, const Window2d& g,
                              float dx_alpha, Tensor& dx, Tensor& dkernel, Tensor& dbias);
}  // namespace kernel
MIXTRAIN_KERNEL_SIGNATURE(conv2d, Conv2dFn)
MIXTRAIN_KERNEL_SIGNATURE(conv2d_backward, Conv2dBackwardFn)

}  // namespace mixtrain::ops
