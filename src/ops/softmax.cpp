// Softmax op entries: validation, output allocation, dispatch (kernels in cpu/softmax.cpp).
#include "mixtrain/ops/softmax.h"
#include "mixtrain/ops/backend.h"

namespace mixtrain::ops {

namespace {
void check_rows(const Tensor& x, const char* op) {
  MIXTRAIN_CHECK(x.defined() && x.rank() >= 1 && is_float(x.dtype()),
                 op << ": expected a floating tensor of rank >= 1 (softmax runs over the last axis), got "
                    << (x.defined() ? x.describe() : std::string("an undefined tensor")));
}

Tensor forward(const Tensor& x, bool log, const char* op) {
  check_rows(x, op);
  const Device device = common_device(op, {&x});
  Tensor xc = x.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), device);
  kernel_for<Op::softmax>(device)(xc, log, y);
  return y;
}

Tensor backward(const Tensor& dy, const Tensor& y, bool log, const char* op) {
  check_rows(y, op);
  MIXTRAIN_CHECK(dy.defined() && is_float(dy.dtype()) && dy.shape() == y.shape(),
                 op << ": gradient " << (dy.defined() ? dy.describe() : std::string("(undefined)")) << " vs output "
                    << y.describe());
  const Device device = common_device(op, {&dy, &y});
  Tensor dyc = dy.contiguous(), yc = y.contiguous();
  Tensor dx = Tensor::empty(y.shape(), y.dtype(), device);
  kernel_for<Op::softmax_backward>(device)(dyc, yc, log, dx);
  return dx;
}
}  // namespace

Tensor softmax(const Tensor& x) { return forward(x, false, "softmax"); }
Tensor softmax_backward(const Tensor& dy, const Tensor& y) { return backward(dy, y, false, "softmax_backward"); }
Tensor log_softmax(const Tensor& x) { return forward(x, true, "log_softmax"); }
Tensor log_softmax_backward(const Tensor& dy, const Tensor& y) { return backward(dy, y, true, "log_softmax_backward"); }

}  // namespace mixtrain::ops
