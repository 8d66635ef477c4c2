// Element-wise product entries: validation, output allocation, dispatch (kernels in cpu/multiply.cpp and
// cuda/multiply.cu).
#include "mixtrain/ops/multiply.h"

#include "mixtrain/ops/backend.h"

namespace mixtrain::ops {

namespace {
std::string described(const Tensor& t) { return t.defined() ? t.describe() : "an undefined tensor"; }

Tensor product(const char* what, const Tensor& a, const Tensor& b, DType out) {
  const Device device = common_device(what, {&a, &b});
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  Tensor y = Tensor::empty(a.shape(), out, device);
  if (y.numel() > 0) kernel_for<Op::multiply>(device)(ac, bc, y);
  return y;
}
}  // namespace

Tensor multiply(const Tensor& a, const Tensor& b) {
  MIXTRAIN_CHECK(a.defined() && b.defined() && is_float(a.dtype()) && a.dtype() == b.dtype() && a.shape() == b.shape(),
                 "multiply: expected two floating tensors of one shape and dtype, got " << described(a) << " and "
                                                                                        << described(b));
  return product("multiply", a, b, a.dtype());
}

Tensor multiply_backward(const Tensor& dy, const Tensor& other) {
  MIXTRAIN_CHECK(other.defined() && is_float(other.dtype()),
                 "multiply_backward: expected a floating operand, got " << described(other));
  MIXTRAIN_CHECK(dy.defined() && is_float(dy.dtype()) && dy.shape() == other.shape(),
                 "multiply_backward: gradient " << described(dy) << " vs operand " << other.describe()
                                                << " (expected a floating tensor of the operand's shape)");
  return product("multiply_backward", dy, other, other.dtype());
}

}  // namespace mixtrain::ops
