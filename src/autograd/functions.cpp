#include "mixtrain/autograd/functions.h"

#include "mixtrain/autograd/autocast.h"
#include "mixtrain/ops/losses.h"
#include "mixtrain/ops/matmul.h"
#include "mixtrain/ops/multiply.h"
#include "mixtrain/ops/softmax.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain {

namespace {
// A new Var for an op's output; it requires grad when the op is recorded.
Var output(Tensor value, bool recorded) { return Var(std::move(value), recorded); }

// Var is a handle: a copy accumulates into the same gradient.
void give(Var input, const Tensor& g) {
  if (input.defined() && input.requires_grad() && g.defined()) input.accumulate_grad(g);
}
// For a gradient freshly computed by the backward op and shared with nothing: the first one is kept
// as the Var's gradient without a copy.
void give_fresh(Var input, Tensor g) {
  if (input.defined() && input.requires_grad() && g.defined()) input.accumulate_grad_owned(std::move(g));
}
}  // namespace

Var cast(const Var& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  const bool rec = should_record({&x});
  Var out = output(x.value().to(dtype), rec);
  if (rec) {
    record_backward(out, [x, out]() { give(x, out.grad()); });  // accumulate_grad converts the dtype
  }
  return out;
}

Var cast_cached(const Var& x, const Tensor& converted) {
  MIXTRAIN_CHECK(x.defined() && converted.defined() && converted.shape() == x.shape(),
                 "cast_cached: the converted value must have the Var's shape");
  if (converted.dtype() == x.dtype()) return x;
  const bool rec = should_record({&x});
  Var out = output(converted, rec);
  if (rec) record_backward(out, [x, out]() { give(x, out.grad()); });
  return out;
}

Var matmul(const Var& a_arg, const Var& b_arg, bool trans_a, bool trans_b) {
  const Var a = autocast_operand(a_arg), b = autocast_operand(b_arg);
  const bool rec = should_record({&a, &b});
  Var out = output(ops::matmul(a.value(), b.value(), trans_a, trans_b), rec);
  if (rec) {
    record_backward(out, [a, b, out, trans_a, trans_b]() {
      auto g = ops::matmul_backward(out.grad(), a.value(), b.value(), trans_a, trans_b, a.requires_grad(),
                                    b.requires_grad());
      give_fresh(a, g.da);
      give_fresh(b, g.db);
    });
  }
  return out;
}

Var linear(const Var& x, const Var& kernel, const Tensor& kernel_compute, const Var& bias) {
  const bool rec = should_record({&x, &kernel, &bias});
  Var out = output(ops::linear(x.value(), kernel_compute, bias.defined() ? bias.value() : Tensor()), rec);
  if (rec) {
    record_backward(out, [x, kernel, kernel_compute, bias, out]() {
      // The kernel's first gradient goes straight into its flat buffer where it has one (ParameterArena).
      const Tensor dw_into = kernel.requires_grad() ? kernel.fresh_gradient_destination(DType::kFloat32) : Tensor();
      auto g = ops::linear_backward(out.grad(), x.value_for_backward(), kernel_compute, x.requires_grad(),
                                    bias.defined() && bias.requires_grad(), dw_into);
      give_fresh(x, g.dx);
      give_fresh(kernel, g.dw);
      give_fresh(bias, g.dbias);
    });
  }
  return out;
}

Var linear_activation(const Var& x, const Var& kernel, const Tensor& kernel_compute, const Var& bias,
                      ops::Activation a) {
  if (a != ops::Activation::kRelu && a != ops::Activation::kGelu)
    return activation(linear(x, kernel, kernel_compute, bias), a);
  const bool rec = should_record({&x, &kernel, &bias});
  ops::LinearActivation r = ops::linear_activation(x.value(), kernel_compute, bias.defined() ? bias.value() : Tensor(),
                                                   a, /*keep_pre_activation=*/rec && a == ops::Activation::kGelu);
  Var out = output(std::move(r.y), rec);
  if (rec) {
    // GELU's derivative reads the pre-activation, so the output can be made again from it, element-wise, with the
    // bits the GEMM's post-op wrote (the same activation code): a reader that needs it in backward (the next
    // Dense's weight gradient) may then let it go until then.
    if (a == ops::Activation::kGelu) out.set_recompute([pre = r.pre_activation, a] { return ops::activation(pre, a); });
    record_backward(out, [x, kernel, kernel_compute, bias, out, pre = std::move(r.pre_activation), a]() {
      const Tensor dw_into = kernel.requires_grad() ? kernel.fresh_gradient_destination(DType::kFloat32) : Tensor();
      // out.value() is undefined when released: GELU's derivative reads pre, relu's (no pre kept) y.
      auto g = ops::linear_activation_backward(out.grad(), x.value_for_backward(), kernel_compute, out.value(), pre,
                                               a, x.requires_grad(), bias.defined() && bias.requires_grad(), dw_into);
      give_fresh(x, g.dx);
      give_fresh(kernel, g.dw);
      give_fresh(bias, g.dbias);
    });
  }
  return out;
}

Var add(const Var& a_arg, const Var& b_arg) {
  const Var a = autocast_operand(a_arg), b = autocast_operand(b_arg);
  const bool rec = should_record({&a, &b});
  Var out = output(ops::add(a.value(), b.value()), rec);
  if (rec) {
    record_backward(out, [a, b, out]() {
      give(a, out.grad());
      give(b, out.grad());
    });
  }
  return out;
}

Var multiply(const Var& a_arg, const Var& b_arg) {
  const Var a = autocast_operand(a_arg), b = autocast_operand(b_arg);
  const bool rec = should_record({&a, &b});
  Var out = output(ops::multiply(a.value(), b.value()), rec);
  if (rec) {
    record_backward(out, [a, b, out]() {
      if (a.requires_grad()) give_fresh(a, ops::multiply_backward(out.grad(), b.value()));
      if (b.requires_grad()) give_fresh(b, ops::multiply_backward(out.grad(), a.value()));
    });
  }
  return out;
}

Var scale(const Var& x_arg, float s) {
  const Var x = autocast_operand(x_arg);
  const bool rec = should_record({&x});
  Var out = output(ops::scale(x.value(), s), rec);
  if (rec) record_backward(out, [x, out, s]() { give(x, ops::scale(out.grad(), s)); });
  return out;
}

Var bias_add(const Var& x_arg, const Var& bias_arg) {
  const Var x = autocast_operand(x_arg), bias = autocast_operand(bias_arg);
  const bool rec = should_record({&x, &bias});
  Var out = output(ops::bias_add(x.value(), bias.value()), rec);
  if (rec) {
    record_backward(out, [x, bias, out]() {
      give(x, out.grad());
      if (bias.requires_grad()) give(bias, ops::sum_rows(out.grad()));
    });
  }
  return out;
}

Var activation(const Var& x_arg, ops::Activation a) {
  const Var x = autocast_operand(x_arg);
  if (a == ops::Activation::kLinear) return x;
  const bool rec = should_record({&x});
  Var out = output(ops::activation(x.value(), a), rec);
  if (rec) {
    // relu and gelu differentiate from the input; sigmoid and tanh from the output.
    record_backward(out, [x, out, a]() {
      give_fresh(x, ops::activation_backward(out.grad(), x.value(), out.value(), a));
    });
  }
  return out;
}

Var softmax(const Var& x_arg) {
  const Var x = autocast_operand(x_arg);
  const bool rec = should_record({&x});
  Var out = output(ops::softmax(x.value()), rec);
  if (rec) record_backward(out, [x, out]() { give_fresh(x, ops::softmax_backward(out.grad(), out.value())); });
  return out;
}

Var log_softmax(const Var& x_arg) {
  const Var x = autocast_operand(x_arg);
  const bool rec = should_record({&x});
  Var out = output(ops::log_softmax(x.value()), rec);
  if (rec) record_backward(out, [x, out]() { give_fresh(x, ops::log_softmax_backward(out.grad(), out.value())); });
  return out;
}

Var dropout(const Var& x_arg, float rate, Rng& rng) {
  const Var x = autocast_operand(x_arg);
  MIXTRAIN_CHECK(rate >= 0.0f && rate < 1.0f, "dropout: rate must be in [0, 1), got " << rate);
  if (rate == 0.0f) return x;
  // One draw from the stream per call picks the mask; the mask is drawn where x lives, the same on every device.
  const Tensor mask = ops::dropout_mask(x.shape(), rate, rng.next_u64(), x.value().device());
  const bool rec = should_record({&x});
  Var out = output(ops::dropout(x.value(), mask, rate), rec);
  if (rec) record_backward(out, [x, out, mask, rate]() { give_fresh(x, ops::dropout_backward(out.grad(), mask, rate)); });
  return out;
}

Var reshape(const Var& x_arg, const Shape& shape) {
  const Var x = autocast_operand(x_arg);
  const bool rec = should_record({&x});
  Var out = output(x.value().reshape(shape), rec);
  if (rec) record_backward(out, [x, out]() { give(x, out.grad().reshape(x.shape())); });
  return out;
}

Var sparse_categorical_crossentropy(const Var& pred_arg, const Tensor& labels, bool from_logits) {
  const Var pred = autocast_operand(pred_arg);
  const bool rec = should_record({&pred});
  Var out = output(ops::sparse_categorical_crossentropy(pred.value(), labels, from_logits), rec);
  if (rec) {
    record_backward(out, [pred, labels, from_logits, out]() {
      give_fresh(pred, ops::sparse_categorical_crossentropy_backward(pred.value(), labels, from_logits, out.grad()));
    });
  }
  return out;
}

Var categorical_crossentropy(const Var& pred_arg, const Tensor& targets, bool from_logits) {
  const Var pred = autocast_operand(pred_arg);
  const bool rec = should_record({&pred});
  Var out = output(ops::categorical_crossentropy(pred.value(), targets, from_logits), rec);
  if (rec) {
    record_backward(out, [pred, targets, from_logits, out]() {
      give_fresh(pred, ops::categorical_crossentropy_backward(pred.value(), targets, from_logits, out.grad()));
    });
  }
  return out;
}

Var mean_squared_error(const Var& pred_arg, const Tensor& target) {
  const Var pred = autocast_operand(pred_arg);
  const bool rec = should_record({&pred});
  Var out = output(ops::mean_squared_error(pred.value(), target), rec);
  if (rec) {
    record_backward(out, [pred, target, out]() {
      give_fresh(pred, ops::mean_squared_error_backward(pred.value(), target, out.grad()));
    });
  }
  return out;
}

Var sum(const Var& x_arg) {
  const Var x = autocast_operand(x_arg);
  const bool rec = should_record({&x});
  Var out = output(ops::sum(x.value()), rec);
  if (rec) record_backward(out, [x, out]() { give(x, ops::sum_backward(x.value(), ops::read_scalar(out.grad()))); });
  return out;
}

Var mean(const Var& x_arg) {
  const Var x = autocast_operand(x_arg);
  const bool rec = should_record({&x});
  Var out = output(ops::mean(x.value()), rec);
  if (rec) record_backward(out, [x, out]() { give(x, ops::mean_backward(x.value(), ops::read_scalar(out.grad()))); });
  return out;
}

Var tap(const Var& x, std::function<void(const Tensor& grad)> on_grad) {
  const bool rec = should_record({&x});
  if (!rec) return x;
  Var out = output(x.value(), true);
  record_backward(out, [x, out, on_grad]() {
    on_grad(out.grad());
    give(x, out.grad());
  });
  return out;
}

}  // namespace mixtrain
