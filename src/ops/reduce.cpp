// reduce_sum entries: validation, output allocation, dispatch (kernels in cpu/reduce.cpp).
#include "mixtrain/ops/reduce.h"
#include "mixtrain/ops/backend.h"

namespace mixtrain::ops {

namespace {
struct Split {
  int axis;
  int64_t outer = 1, n = 1, inner = 1;
  Shape reduced;  // the result's shape
};

Split split(const Tensor& x, int axis, bool keepdims, const char* op) {
  MIXTRAIN_CHECK(x.defined() && is_float(x.dtype()) && x.rank() >= 1,
                 op << ": expected a floating tensor of rank >= 1, got "
                    << (x.defined() ? x.describe() : std::string("an undefined tensor")));
  MIXTRAIN_CHECK(axis >= -x.rank() && axis < x.rank(),
                 op << ": axis " << axis << " is outside [" << -x.rank() << ", " << x.rank() << ") for " << x.describe());
  Split s;
  s.axis = axis < 0 ? axis + x.rank() : axis;
  std::vector<int64_t> dims;
  for (int d = 0; d < x.rank(); ++d) {
    if (d < s.axis) s.outer *= x.dim(d);
    if (d > s.axis) s.inner *= x.dim(d);
    if (d != s.axis) dims.push_back(x.dim(d));
    else if (keepdims) dims.push_back(1);
  }
  s.n = x.dim(s.axis);
  s.reduced = Shape(dims);
  return s;
}
}  // namespace

Tensor reduce_sum(const Tensor& x, int axis, bool keepdims, std::optional<DType> out_dtype) {
  const Split s = split(x, axis, keepdims, "reduce_sum");
  const DType dtype = out_dtype.value_or(x.dtype());
  MIXTRAIN_CHECK(is_float(dtype), "reduce_sum: the output dtype must be floating, got " << dtype_name(dtype));
  const Device device = common_device("reduce_sum", {&x});
  Tensor y = Tensor::empty(s.reduced, dtype, device);
  kernel_for<Op::reduce_sum>(device)(x.contiguous(), s.outer, s.n, s.inner, y);
  return y;
}

Tensor reduce_sum_backward(const Tensor& dy, const Tensor& x, int axis, bool keepdims) {
  const Split s = split(x, axis, keepdims, "reduce_sum_backward");
  MIXTRAIN_CHECK(dy.defined() && is_float(dy.dtype()) && dy.shape() == s.reduced,
                 "reduce_sum_backward: gradient " << (dy.defined() ? dy.describe() : std::string("(undefined)"))
                                                  << " does not match the sum's shape " << s.reduced);
  const Device device = common_device("reduce_sum_backward", {&dy, &x});
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), device);
  kernel_for<Op::reduce_sum_backward>(device)(dy.contiguous(), s.outer, s.n, s.inner, dx);
  return dx;
}

}  // namespace mixtrain::ops
