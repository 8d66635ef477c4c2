#include "mixtrain/ops/conv2d.h"
#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/dtype_check.h"
#include "mixtrain/ops/transfer.h"

#include <algorithm>

namespace mixtrain::ops {

Padding parse_padding(std::string_view name) {
  if (name == "valid") return Padding::kValid;
  if (name == "same") return Padding::kSame;
  MIXTRAIN_FAIL(kInvalidInput, "unknown padding '" << name << "'", "valid paddings: valid, same");
}

const char* padding_name(Padding p) { return p == Padding::kSame ? "same" : "valid"; }

Axis window_axis(int64_t in, int64_t window, int64_t stride, Padding padding, const char* op) {
  MIXTRAIN_CHECK(window > 0 && stride > 0,
                 op << ": window and stride must be positive, got window " << window << ", stride " << stride);
  MIXTRAIN_CHECK(in >= 0, op << ": negative spatial size " << in);
  Axis a;
  a.in = in;
  a.window = window;
  a.stride = stride;
  if (padding == Padding::kValid) {
    a.out = in >= window ? (in - window) / stride + 1 : 0;
  } else {
    a.out = (in + stride - 1) / stride;
    const int64_t pad_total = std::max<int64_t>((a.out - 1) * stride + window - in, 0);
    a.pad_before = pad_total / 2;
  }
  return a;
}

Window2d window_2d(const Shape& x_shape, Size2 window, Size2 strides, Padding padding, const char* op) {
  MIXTRAIN_CHECK(x_shape.rank() == 4, op << ": input must be (batch, height, width, channels), got shape " << x_shape);
  Window2d g;
  g.batch = x_shape[0];
  g.channels = x_shape[3];
  g.h = window_axis(x_shape[1], window.h, strides.h, padding, op);
  g.w = window_axis(x_shape[2], window.w, strides.w, padding, op);
  MIXTRAIN_CHECK(g.h.out > 0 && g.w.out > 0, op << ": window " << window.h << "x" << window.w
                                                 << " does not fit input " << x_shape << " with padding '"
                                                 << padding_name(padding) << "'");
  return g;
}

namespace {
void check_conv_args(const Tensor& x, const Tensor& kernel, const char* op) {
  MIXTRAIN_CHECK(x.defined() && is_float(x.dtype()) && x.rank() == 4,
                 op << ": input must be a floating (batch, height, width, channels) tensor, got "
                    << (x.defined() ? x.describe() : std::string("undefined")));
  MIXTRAIN_CHECK(kernel.defined() && kernel.rank() == 4,
                 op << ": kernel must be (kh, kw, cin, cout), got "
                    << (kernel.defined() ? kernel.describe() : std::string("undefined")));
  check_same_dtype(op, "input", x, "kernel", kernel);
  MIXTRAIN_CHECK(x.dim(3) == kernel.dim(2), op << ": input " << x.describe() << " has " << x.dim(3)
                                               << " channels, kernel " << kernel.describe() << " expects "
                                               << kernel.dim(2));
}

Window2d conv_geometry(const Shape& x_shape, const Shape& kernel_shape, const Conv2dOptions& o, const char* op) {
  return window_2d(x_shape, Size2(kernel_shape[0], kernel_shape[1]), o.strides, o.padding, op);
}

// An output dtype a convolution of x may round into: x's own, or float32.
DType conv_output_dtype(const Tensor& x, std::optional<DType> wanted, const char* op) {
  const DType dtype = wanted.value_or(x.dtype());
  MIXTRAIN_CHECK(dtype == x.dtype() || dtype == DType::kFloat32,
                 op << ": the output is the input's dtype (" << dtype_name(x.dtype()) << ") or float32, not "
                    << dtype_name(dtype));
  return dtype;
}

}  // namespace

Shape conv2d_output_shape(const Shape& x_shape, const Shape& kernel_shape, const Conv2dOptions& options) {
  MIXTRAIN_CHECK(kernel_shape.rank() == 4, "conv2d: kernel must be (kh, kw, cin, cout), got " << kernel_shape);
  const Window2d g = conv_geometry(x_shape, kernel_shape, options, "conv2d");
  return Shape{g.batch, g.h.out, g.w.out, kernel_shape[3]};
}

Tensor conv2d(const Tensor& x, const Tensor& kernel, const Tensor& bias, const Conv2dOptions& options,
              std::optional<DType> y_dtype, float alpha) {
  check_conv_args(x, kernel, "conv2d");
  const DType out = conv_output_dtype(x, y_dtype, "conv2d");
  if (bias.defined())
    MIXTRAIN_CHECK(bias.dtype() == DType::kFloat32 && bias.rank() == 1 && bias.numel() == kernel.dim(3),
                   "conv2d: bias must be float32 (" << kernel.dim(3) << ",), got " << bias.describe());
  const Device device = common_device("conv2d", {&x, &kernel, &bias});
  const Window2d g = conv_geometry(x.shape(), kernel.shape(), options, "conv2d");
  Tensor y = Tensor::empty({g.batch, g.h.out, g.w.out, kernel.dim(3)}, out, device);
  kernel_for<Op::conv2d>(device)(x.contiguous(), kernel.contiguous(), bias.defined() ? bias.contiguous() : bias, g,
                                 alpha, y);
  return y;
}

Conv2dGrads conv2d_backward(const Tensor& dy, const Tensor& x, const Tensor& kernel, const Conv2dOptions& options,
                            bool need_x, bool need_bias, std::optional<DType> dx_dtype, float dx_alpha) {
  check_conv_args(x, kernel, "conv2d_backward");
  const DType dx_out = conv_output_dtype(x, dx_dtype, "conv2d_backward");
  const Device device = common_device("conv2d_backward", {&dy, &x, &kernel});
  const Window2d g = conv_geometry(x.shape(), kernel.shape(), options, "conv2d_backward");
  const Shape y_shape{g.batch, g.h.out, g.w.out, kernel.dim(3)};
  MIXTRAIN_CHECK(dy.defined() && is_float(dy.dtype()) && dy.shape() == y_shape,
                 "conv2d_backward: gradient " << (dy.defined() ? dy.describe() : std::string("undefined"))
                                              << " does not match the output shape " << y_shape);
  Conv2dGrads grads;
  if (need_x) grads.dx = Tensor::empty(x.shape(), dx_out, device);
  grads.dkernel = Tensor::empty(kernel.shape(), DType::kFloat32, device);
  if (need_bias) grads.dbias = Tensor::empty({kernel.dim(3)}, DType::kFloat32, device);
  kernel_for<Op::conv2d_backward>(device)(cast(dy, x.dtype()).contiguous(), x.contiguous(), kernel.contiguous(), g,
                                          dx_alpha, grads.dx, grads.dkernel, grads.dbias);
  return grads;
}

}  // namespace mixtrain::ops
