#include "mixtrain/ops/pooling.h"
#include "mixtrain/ops/backend.h"

namespace mixtrain::ops {

namespace {
void check_image(const Tensor& x, const char* op) {
  MIXTRAIN_CHECK(x.defined() && is_float(x.dtype()) && x.rank() == 4,
                 op << ": input must be a floating (batch, height, width, channels) tensor, got "
                    << (x.defined() ? x.describe() : std::string("undefined")));
}

void check_gradient(const Tensor& dy, const Shape& want, const char* op) {
  MIXTRAIN_CHECK(dy.defined() && is_float(dy.dtype()) && dy.shape() == want,
                 op << ": gradient " << (dy.defined() ? dy.describe() : std::string("undefined"))
                    << " does not match the output shape " << want);
}

Window2d pool_geometry(const Shape& x_shape, const Pool2dOptions& o, const char* op) {
  return window_2d(x_shape, o.pool_size, o.strides, o.padding, op);
}

Tensor pool(const Tensor& x, const Pool2dOptions& o, PoolKind kind, const char* op) {
  check_image(x, op);
  const Device device = common_device(op, {&x});
  const Window2d g = pool_geometry(x.shape(), o, op);
  Tensor y = Tensor::empty({g.batch, g.h.out, g.w.out, g.channels}, x.dtype(), device);
  kernel_for<Op::pool2d>(device)(x.contiguous(), kind, g, y);
  return y;
}
}  // namespace

Shape pool2d_output_shape(const Shape& x_shape, const Pool2dOptions& options) {
  const Window2d g = pool_geometry(x_shape, options, "pool2d");
  return Shape{g.batch, g.h.out, g.w.out, g.channels};
}

Tensor max_pool2d(const Tensor& x, const Pool2dOptions& options) { return pool(x, options, PoolKind::kMax, "max_pool2d"); }

Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& options) {
  return pool(x, options, PoolKind::kAverage, "avg_pool2d");
}

Tensor max_pool2d_backward(const Tensor& dy, const Tensor& x, const Pool2dOptions& options) {
  constexpr const char* op = "max_pool2d_backward";
  check_image(x, op);
  const Device device = common_device(op, {&dy, &x});
  const Window2d g = pool_geometry(x.shape(), options, op);
  check_gradient(dy, Shape{g.batch, g.h.out, g.w.out, g.channels}, op);
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), device);
  kernel_for<Op::pool2d_backward>(device)(dy.contiguous(), x.contiguous(), PoolKind::kMax, g, dx);
  return dx;
}

Tensor avg_pool2d_backward(const Tensor& dy, const Shape& x_shape, DType x_dtype, const Pool2dOptions& options) {
  constexpr const char* op = "avg_pool2d_backward";
  MIXTRAIN_CHECK(is_float(x_dtype), op << ": input dtype must be floating, got " << dtype_name(x_dtype));
  const Device device = common_device(op, {&dy});
  const Window2d g = pool_geometry(x_shape, options, op);
  check_gradient(dy, Shape{g.batch, g.h.out, g.w.out, g.channels}, op);
  Tensor dx = Tensor::empty(x_shape, x_dtype, device);
  kernel_for<Op::pool2d_backward>(device)(dy.contiguous(), Tensor(), PoolKind::kAverage, g, dx);
  return dx;
}

Tensor global_average_pool2d(const Tensor& x) {
  constexpr const char* op = "global_average_pool2d";
  check_image(x, op);
  const Device device = common_device(op, {&x});
  Tensor y = Tensor::empty({x.dim(0), x.dim(3)}, x.dtype(), device);
  kernel_for<Op::global_average_pool2d>(device)(x.contiguous(), y);
  return y;
}

Tensor global_average_pool2d_backward(const Tensor& dy, const Shape& x_shape, DType x_dtype) {
  constexpr const char* op = "global_average_pool2d_backward";
  MIXTRAIN_CHECK(x_shape.rank() == 4 && is_float(x_dtype),
                 op << ": input must be a floating (batch, height, width, channels) tensor, got "
                    << dtype_name(x_dtype) << " " << x_shape);
  check_gradient(dy, Shape{x_shape[0], x_shape[3]}, op);
  const Device device = common_device(op, {&dy});
  Tensor dx = Tensor::empty(x_shape, x_dtype, device);
  kernel_for<Op::global_average_pool2d_backward>(device)(dy.contiguous(), dx);
  return dx;
}

}  // namespace mixtrain::ops
