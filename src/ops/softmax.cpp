// Softmax op entries: validation, output allocation, dispatch (kernels in cpu/softmax.cpp).
#include "mixtrain/ops/softmax.h"

namespace mixtrain::ops {

namespace cpu {
void softmax(const Tensor& x, bool log, Tensor& y);
void softmax_backward(const Tensor& dy, const Tensor& y, bool log, Tensor& dx);
}  // namespace cpu

namespace kernel {
KernelTable<SoftmaxFn>& softmax_table() {
  static KernelTable<SoftmaxFn> t("softmax", &cpu::softmax);
  return t;
}
KernelTable<SoftmaxBackwardFn>& softmax_backward_table() {
  static KernelTable<SoftmaxBackwardFn> t("softmax_backward", &cpu::softmax_backward);
  return t;
}
}  // namespace kernel

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
  kernel::softmax_table()(device)(xc, log, y);
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
  kernel::softmax_backward_table()(device)(dyc, yc, log, dx);
  return dx;
}
}  // namespace

Tensor softmax(const Tensor& x) { return forward(x, false, "softmax"); }
Tensor softmax_backward(const Tensor& dy, const Tensor& y) { return backward(dy, y, false, "softmax_backward"); }
Tensor log_softmax(const Tensor& x) { return forward(x, true, "log_softmax"); }
Tensor log_softmax_backward(const Tensor& dy, const Tensor& y) { return backward(dy, y, true, "log_softmax_backward"); }

}  // namespace mixtrain::ops
