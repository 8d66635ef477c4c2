// Elementwise op entries: validation, output allocation, dispatch (kernels in cpu/elementwise.cpp).
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/backend.h"

#include "mixtrain/ops/transfer.h"

namespace mixtrain::ops {

namespace {
void check_float(const Tensor& t, const char* op, const char* what) {
  MIXTRAIN_CHECK(t.defined() && is_float(t.dtype()),
                 op << ": " << what << " must be a floating tensor, got "
                    << (t.defined() ? t.describe() : std::string("an undefined tensor")));
}

void check_same_shape(const Tensor& a, const Tensor& b, const char* op) {
  check_float(a, op, "the first operand");
  check_float(b, op, "the second operand");
  MIXTRAIN_CHECK(a.shape() == b.shape(), op << ": shapes differ: " << a.describe() << " and " << b.describe());
}
}  // namespace

Activation parse_activation(std::string_view name) {
  if (name.empty() || name == "linear" || name == "none") return Activation::kLinear;
  if (name == "relu") return Activation::kRelu;
  if (name == "gelu") return Activation::kGelu;
  if (name == "sigmoid") return Activation::kSigmoid;
  if (name == "tanh") return Activation::kTanh;
  MIXTRAIN_FAIL(kInvalidInput, "unknown activation '" << name << "'", "valid activations: linear, relu, gelu, sigmoid, tanh");
}

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::kLinear: return "linear";
    case Activation::kRelu: return "relu";
    case Activation::kGelu: return "gelu";
    case Activation::kSigmoid: return "sigmoid";
    case Activation::kTanh: return "tanh";
  }
  return "?";
}

Tensor activation(const Tensor& x, Activation a) {
  if (a == Activation::kLinear) return x;
  check_float(x, activation_name(a), "the input");
  const Device device = common_device("activation", {&x});
  Tensor xc = x.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), device);
  kernel_for<Op::activation>(device)(xc, a, y);
  return y;
}

// Every backend's activation kernel is element-wise (each output reads its own input element only), so y may be x.
void activation_in_place(Tensor& x, Activation a) {
  if (a == Activation::kLinear) return;
  check_float(x, activation_name(a), "the input");
  MIXTRAIN_CHECK(x.is_contiguous(), "activation_in_place: x must be contiguous, got " << x.describe());
  const Device device = common_device("activation", {&x});
  kernel_for<Op::activation>(device)(x, a, x);
}

Tensor activation_backward(const Tensor& dy, const Tensor& x, const Tensor& y, Activation a) {
  if (a == Activation::kLinear) return cast(dy, x.dtype());
  // relu and gelu differentiate from the input, sigmoid and tanh from the output.
  const bool from_input = a == Activation::kRelu || a == Activation::kGelu;
  const Tensor& saved = from_input ? x : y;
  const char* op = "activation_backward";
  check_same_shape(dy, saved, op);
  const Device device = common_device(op, {&dy, &saved});
  Tensor dyc = dy.contiguous(), sc = saved.contiguous();
  Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), device);
  kernel_for<Op::activation_backward>(device)(dyc, sc, a, dx);
  return dx;
}

Tensor add(const Tensor& a, const Tensor& b) {
  check_same_shape(a, b, "add");
  const Device device = common_device("add", {&a, &b});
  Tensor ac = a.contiguous(), bc = b.contiguous();
  Tensor y = Tensor::empty(a.shape(), a.dtype(), device);
  kernel_for<Op::add>(device)(ac, bc, y);
  return y;
}

void add_into(Tensor& acc, const Tensor& g) {
  check_same_shape(acc, g, "add_into");
  MIXTRAIN_CHECK(acc.is_contiguous() && is_float(acc.dtype()) && is_float(g.dtype()),
                 "add_into: the accumulator " << acc.describe() << " must be contiguous and floating, and "
                                              << g.describe() << " floating");
  const Device device = common_device("add_into", {&acc, &g});
  // The kernel reads each block of both operands before writing it, so y may be the first operand.
  kernel_for<Op::add>(device)(acc, g.contiguous(), acc);
}

Tensor scale(const Tensor& a, float s) {
  check_float(a, "scale", "the input");
  const Device device = common_device("scale", {&a});
  Tensor ac = a.contiguous();
  Tensor y = Tensor::empty(a.shape(), a.dtype(), device);
  kernel_for<Op::scale>(device)(ac, s, y);
  return y;
}

void scale_in_place(Tensor& x, float s) {
  check_float(x, "scale_in_place", "the tensor");
  MIXTRAIN_CHECK(x.is_contiguous(), "scale_in_place: the tensor must be contiguous, got " << x.describe());
  const Device device = common_device("scale_in_place", {&x});
  // Every kernel of the table reads element i before it writes element i and touches no other: y may be x.
  kernel_for<Op::scale>(device)(x, s, x);
}

Tensor bias_add(const Tensor& x, const Tensor& bias) {
  check_float(x, "bias_add", "the input");
  check_float(bias, "bias_add", "the bias");
  MIXTRAIN_CHECK(x.rank() >= 1 && bias.rank() == 1 && bias.dim(0) == x.dim(-1),
                 "bias_add: bias " << bias.describe() << " does not match the last axis of " << x.describe());
  const Device device = common_device("bias_add", {&x, &bias});
  Tensor xc = x.contiguous(), bc = bias.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), device);
  kernel_for<Op::bias_add>(device)(xc, bc, y);
  return y;
}

Tensor sum_rows(const Tensor& dy) {
  check_float(dy, "sum_rows", "the input");
  MIXTRAIN_CHECK(dy.rank() >= 1, "sum_rows: expected a tensor of rank >= 1, got " << dy.describe());
  const Device device = common_device("sum_rows", {&dy});
  Tensor dyc = dy.contiguous();
  Tensor out = Tensor::empty({dy.dim(-1)}, DType::kFloat32, device);
  kernel_for<Op::sum_rows>(device)(dyc, out);
  return out;
}

Tensor dropout(const Tensor& x, const Tensor& mask, float rate) {
  check_float(x, "dropout", "the input");
  MIXTRAIN_CHECK(rate >= 0.0f && rate < 1.0f, "dropout: rate must be in [0, 1), got " << rate);
  MIXTRAIN_CHECK(mask.defined() && mask.dtype() == DType::kUInt8 && mask.numel() == x.numel(),
                 "dropout: mask " << (mask.defined() ? mask.describe() : std::string("(undefined)"))
                                  << " does not match " << x.describe());
  const Device device = common_device("dropout", {&x, &mask});
  Tensor xc = x.contiguous(), mc = mask.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), device);
  kernel_for<Op::dropout>(device)(xc, mc, 1.0f / (1.0f - rate), y);
  return y;
}

Tensor dropout_backward(const Tensor& dy, const Tensor& mask, float rate) { return dropout(dy, mask, rate); }

Tensor dropout_mask(const Shape& shape, float rate, uint64_t seed, const Device& device) {
  MIXTRAIN_CHECK(rate >= 0.0f && rate < 1.0f, "dropout_mask: rate must be in [0, 1), got " << rate);
  Tensor mask = Tensor::empty(shape, DType::kUInt8, device);
  if (mask.numel() > 0) kernel_for<Op::dropout_mask>(device)(rate, seed, mask);
  return mask;
}

void fill(Tensor& y, float value) {
  MIXTRAIN_CHECK(y.defined() && is_float(y.dtype()) && y.is_contiguous(),
                 "fill: the tensor must be a contiguous floating tensor, got "
                     << (y.defined() ? y.describe() : std::string("an undefined tensor")));
  kernel_for<Op::fill>(y.device())(y, value);
}

Tensor full(const Shape& shape, DType dtype, float value, const Device& device) {
  if (device.is_cpu()) return value == 0.0f ? Tensor::zeros(shape, dtype) : Tensor::full(shape, dtype, value);
  Tensor t = Tensor::empty(shape, dtype, device);
  fill(t, value);
  return t;
}

int64_t count_nonfinite(const Tensor& x) {
  if (!x.defined() || !is_float(x.dtype()) || x.numel() == 0) return 0;
  const Device device = common_device("count_nonfinite", {&x});
  return kernel_for<Op::count_nonfinite>(device)(x.contiguous());
}

bool all_finite(const std::vector<Tensor>& xs) {
  for (const Tensor& x : xs)
    if (count_nonfinite(x) != 0) return false;
  return true;
}

}  // namespace mixtrain::ops
