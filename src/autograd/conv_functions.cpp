#include "mixtrain/autograd/conv_functions.h"

#include "mixtrain/autograd/autocast.h"

namespace mixtrain {

namespace {
// A new Var for an op's output; it requires grad when the op is recorded.
Var output(Tensor value, bool recorded) { return Var(std::move(value), recorded); }

// For a gradient freshly computed by the backward op and shared with nothing: the first one is kept as
// the Var's gradient without a copy.
void give_fresh(Var input, Tensor g) {
  if (input.defined() && input.requires_grad() && g.defined()) input.accumulate_grad_owned(std::move(g));
}
}  // namespace

Var conv2d(const Var& x, const Var& kernel, const Tensor& kernel_compute, const Var& bias,
           const ops::Conv2dOptions& options) {
  const bool rec = should_record({&x, &kernel, &bias});
  Var out = output(ops::conv2d(x.value(), kernel_compute, bias.defined() ? bias.value() : Tensor(), options), rec);
  if (rec) {
    record_backward(out, [x, kernel, kernel_compute, bias, out, options]() {
      auto g = ops::conv2d_backward(out.grad(), x.value(), kernel_compute, options, x.requires_grad(),
                                    bias.defined() && bias.requires_grad());
      give_fresh(x, g.dx);
      give_fresh(kernel, g.dkernel);
      give_fresh(bias, g.dbias);
    });
  }
  return out;
}

Var max_pool2d(const Var& x_arg, const ops::Pool2dOptions& options) {
  const Var x = autocast_operand(x_arg);
  const bool rec = should_record({&x});
  Var out = output(ops::max_pool2d(x.value(), options), rec);
  // The backward pass finds each window's maximum again in x (kept for it anyway by the producer of x
  // in a Conv-ReLU-Pool stack), rather than storing positions.
  if (rec)
    record_backward(out, [x, out, options]() { give_fresh(x, ops::max_pool2d_backward(out.grad(), x.value(), options)); });
  return out;
}

Var avg_pool2d(const Var& x_arg, const ops::Pool2dOptions& options) {
  const Var x = autocast_operand(x_arg);
  const bool rec = should_record({&x});
  Var out = output(ops::avg_pool2d(x.value(), options), rec);
  if (rec) {
    // Only the shape and dtype of x are needed: the closure does not keep x's value alive.
    const Shape shape = x.shape();
    const DType dtype = x.dtype();
    record_backward(out, [x, out, options, shape, dtype]() {
      if (x.requires_grad()) give_fresh(x, ops::avg_pool2d_backward(out.grad(), shape, dtype, options));
    });
  }
  return out;
}

Var global_average_pool2d(const Var& x_arg) {
  const Var x = autocast_operand(x_arg);
  const bool rec = should_record({&x});
  Var out = output(ops::global_average_pool2d(x.value()), rec);
  if (rec) {
    const Shape shape = x.shape();
    const DType dtype = x.dtype();
    record_backward(out, [x, out, shape, dtype]() {
      if (x.requires_grad()) give_fresh(x, ops::global_average_pool2d_backward(out.grad(), shape, dtype));
    });
  }
  return out;
}

BatchNormOutput batch_norm(const Var& x, const Var& gamma, const Var& beta, const Tensor& moving_mean,
                           const Tensor& moving_variance, float epsilon, bool training) {
  BatchNormOutput r;
  if (training) r.batch = ops::batch_moments(x.value());
  const Tensor mean = training ? r.batch.mean : moving_mean;
  const Tensor variance = training ? r.batch.variance : moving_variance;
  const bool rec = should_record({&x, &gamma, &beta});
  r.y = output(ops::batch_norm(x.value(), mean, variance, gamma.value(), beta.value(), epsilon), rec);
  if (rec) {
    Var out = r.y;
    record_backward(out, [x, gamma, beta, mean, variance, epsilon, training, out]() {
      auto g = ops::batch_norm_backward(out.grad(), x.value(), mean, variance, gamma.value(), epsilon, training,
                                        x.requires_grad());
      give_fresh(x, g.dx);
      give_fresh(gamma, g.dgamma);
      give_fresh(beta, g.dbeta);
    });
  }
  return r;
}

}  // namespace mixtrain
