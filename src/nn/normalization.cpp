#include "mixtrain/nn/normalization.h"

#include <cmath>
#include <vector>

#include "mixtrain/ops/batch_norm.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain {

BatchNormalization::BatchNormalization(float momentum, float epsilon, DTypeArg dtype, const std::string& name)
    : Layer("batch_normalization", std::move(dtype), name), momentum_(momentum), epsilon_(epsilon) {
  MIXTRAIN_CHECK(momentum >= 0.0f && momentum <= 1.0f, "BatchNormalization: momentum must be in [0, 1], got " << momentum);
  MIXTRAIN_CHECK(epsilon > 0.0f, "BatchNormalization: epsilon must be positive, got " << epsilon);
}

void BatchNormalization::build_impl(const Shape& input_shape, Rng& rng) {
  MIXTRAIN_CHECK(input_shape.rank() >= 1 && input_shape[-1] > 0,
                 "BatchNormalization '" << name() << "' needs a channel axis last, got per-sample shape " << input_shape);
  const Shape c{input_shape[-1]};
  gamma_ = add_weight("gamma", c, Initializer::kOnes, rng);
  beta_ = add_weight("beta", c, Initializer::kZeros, rng);
  // Saved in checkpoints, never optimized, never given a gradient; the variable dtype (float32 under the
  // mixed policies).
  moving_mean_ = add_non_trainable_weight("moving_mean", c, Initializer::kZeros, rng);
  moving_variance_ = add_non_trainable_weight("moving_variance", c, Initializer::kOnes, rng);
}

Var BatchNormalization::call(const Var& x, const CallContext& ctx) {
  MIXTRAIN_CHECK(x.value().rank() >= 2 && x.shape()[-1] == gamma_.shape()[0],
                 "BatchNormalization '" << name() << "' was built for " << gamma_.shape()[0] << " channels, got "
                                        << x.value().describe());
  // float32 math whatever the policy: the parameters are read in float32 (their gradient is converted
  // back when a pure 16-bit policy stores them in 16 bits).
  const Var gamma = gamma_.dtype() == DType::kFloat32 ? gamma_ : cast(gamma_, DType::kFloat32);
  const Var beta = beta_.dtype() == DType::kFloat32 ? beta_ : cast(beta_, DType::kFloat32);
  if (ctx.training && synchronized_ && communicator_ && communicator_->size() > 1)
    return call_synchronized(x, gamma, beta, *communicator_);
  BatchNormOutput out = batch_norm(x, gamma, beta, moving_mean_.value().to(DType::kFloat32),
                                   moving_variance_.value().to(DType::kFloat32), epsilon_, ctx.training);
  if (ctx.training) update_moving_statistics(out.batch.mean, out.batch.variance);
  return out.y;
}

void BatchNormalization::update_moving_statistics(const Tensor& mean, const Tensor& variance) {
  const Device device = mean.device();
  if (!skipped_moving_updates_.defined()) {
    skipped_moving_updates_ = ops::full({1}, DType::kFloat32, 0.0f, device);
  } else if (skipped_moving_updates_.device() != device) {
    skipped_moving_updates_ = ops::to_device(skipped_moving_updates_, device);  // the model moved
  }
  // In host memory the skip is seen at once, and a skipped batch leaves even the versions as they were; on a device
  // the variables take the kernel's result either way (the old values after a skip).
  const float skipped_before = device.is_cpu() ? skipped_moving_updates_.data<float>()[0] : 0.0f;
  const ops::BatchNormStats next =
      ops::update_moving_statistics(moving_mean_.value().to(DType::kFloat32), moving_variance_.value().to(DType::kFloat32),
                                    {mean, variance}, momentum_, skipped_moving_updates_);
  if (device.is_cpu() && skipped_moving_updates_.data<float>()[0] != skipped_before) return;
  moving_mean_.set_value(next.mean);  // converted to the variable dtype; bumps the version
  moving_variance_.set_value(next.variance);
}

int64_t BatchNormalization::skipped_moving_updates() const {
  return skipped_moving_updates_.defined() ? static_cast<int64_t>(ops::read_scalar(skipped_moving_updates_)) : 0;
}

namespace {
// The communicator reduces host buffers: statistics of a layer on a device are computed from a host copy, and what
// they give goes back to the device (a copy each way per call; CPU tensors are used as they are).
Tensor on_host(const Tensor& t) { return ops::to_device(t.contiguous(), Device::cpu()); }
}  // namespace

Var BatchNormalization::call_synchronized(const Var& x, const Var& gamma, const Var& beta, Communicator& comm) {
  const int64_t C = gamma.shape()[0];
  const Device device = x.value().device();
  const Tensor xf = on_host(x.value()).to(DType::kFloat32).contiguous();  // read as (rows, C)
  const int64_t rows = xf.numel() / C;
  const float* xp = xf.data<float>();
  // The global mean: one all-reduce of {rows, per-channel sums}; then the global biased variance from the
  // squared deviations about it (two passes, as the local statistics, so a large mean does not cancel it).
  std::vector<double> sums(static_cast<size_t>(C + 1), 0.0);
  sums[0] = static_cast<double>(rows);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < C; ++c) sums[static_cast<size_t>(c + 1)] += xp[r * C + c];
  comm.all_reduce(sums.data(), C + 1, ReduceOp::kSum);
  const double total = sums[0];
  MIXTRAIN_CHECK(total > 0, "BatchNormalization '" << name() << "': the global batch is empty");
  std::vector<double> mean(static_cast<size_t>(C)), squares(static_cast<size_t>(C), 0.0);
  for (int64_t c = 0; c < C; ++c) mean[static_cast<size_t>(c)] = sums[static_cast<size_t>(c + 1)] / total;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const double d = xp[r * C + c] - mean[static_cast<size_t>(c)];
      squares[static_cast<size_t>(c)] += d * d;
    }
  comm.all_reduce(squares.data(), C, ReduceOp::kSum);
  Tensor mean_t = Tensor::empty({C}, DType::kFloat32), var_t = Tensor::empty({C}, DType::kFloat32);
  for (int64_t c = 0; c < C; ++c) {
    mean_t.data<float>()[c] = static_cast<float>(mean[static_cast<size_t>(c)]);
    var_t.data<float>()[c] = static_cast<float>(squares[static_cast<size_t>(c)] / total);
  }
  const Tensor mean_d = ops::to_device(mean_t, device), var_d = ops::to_device(var_t, device);
  update_moving_statistics(mean_d, var_d);  // the same on every rank: the statistics are global

  const bool rec = should_record({&x, &gamma, &beta});
  Var y(ops::batch_norm(x.value(), mean_d, var_d, gamma.value(), beta.value(), epsilon_), rec);
  if (!rec) return y;
  const float eps = epsilon_;
  Communicator* c_ptr = &comm;
  record_backward(y, [x, gamma, beta, y, xf, mean_t, var_t, eps, C, rows, total, c_ptr, device]() {
    // dy is this rank's loss gradient; the gradient all-reduce later weighs this rank by share = rows / total.
    // The global loss's dy on these rows is share * dy, so the global per-channel sums are
    // T = sum over ranks of share * (sum dy, sum dy * xhat), and this rank's input gradient, in its own scale, is
    //   dx = gamma * rstd * (dy - (T_dy + xhat * T_dyxhat) / rows).
    const Tensor dyf = on_host(y.grad()).to(DType::kFloat32).contiguous();
    const float* dy = dyf.data<float>();
    const float* xv = xf.data<float>();
    const float* m = mean_t.data<float>();
    const Tensor gf = on_host(gamma.value()).to(DType::kFloat32);
    const float* g = gf.data<float>();
    std::vector<float> rstd(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) rstd[static_cast<size_t>(c)] = 1.0f / std::sqrt(var_t.data<float>()[c] + eps);
    std::vector<double> local(static_cast<size_t>(2 * C), 0.0);  // sum dy, sum dy * xhat
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const float xhat = (xv[r * C + c] - m[c]) * rstd[static_cast<size_t>(c)];
        local[static_cast<size_t>(c)] += dy[r * C + c];
        local[static_cast<size_t>(C + c)] += static_cast<double>(dy[r * C + c]) * xhat;
      }
    Tensor dbeta = Tensor::empty({C}, DType::kFloat32), dgamma = Tensor::empty({C}, DType::kFloat32);
    for (int64_t c = 0; c < C; ++c) {
      dbeta.data<float>()[c] = static_cast<float>(local[static_cast<size_t>(c)]);
      dgamma.data<float>()[c] = static_cast<float>(local[static_cast<size_t>(C + c)]);
    }
    const double share = static_cast<double>(rows) / total;
    std::vector<double> global(local);
    for (double& v : global) v *= share;
    c_ptr->all_reduce(global.data(), 2 * C, ReduceOp::kSum);
    if (x.requires_grad()) {
      Tensor dx = Tensor::empty(xf.shape(), DType::kFloat32);
      float* dxp = dx.data<float>();
      const double inv_rows = 1.0 / static_cast<double>(rows);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < C; ++c) {
          const float xhat = (xv[r * C + c] - m[c]) * rstd[static_cast<size_t>(c)];
          const double correction =
              (global[static_cast<size_t>(c)] + xhat * global[static_cast<size_t>(C + c)]) * inv_rows;
          dxp[r * C + c] = g[c] * rstd[static_cast<size_t>(c)] * static_cast<float>(dy[r * C + c] - correction);
        }
      Var xv_var = x;
      xv_var.accumulate_grad_owned(ops::to_device(x.dtype() == DType::kFloat32 ? dx : dx.to(x.dtype()), device));
    }
    if (gamma.requires_grad()) Var(gamma).accumulate_grad_owned(ops::to_device(dgamma, device));
    if (beta.requires_grad()) Var(beta).accumulate_grad_owned(ops::to_device(dbeta, device));
  });
  return y;
}

}  // namespace mixtrain
