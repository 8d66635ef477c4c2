#include "mixtrain/nn/normalization.h"

#include <cmath>
#include <vector>

#include "mixtrain/ops/elementwise.h"

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
  auto finite = [](const Tensor& t) {
    // On a device the count comes back to the host: a wait per training step there (BatchNormalization's only).
    if (!t.device().is_cpu()) return ops::count_nonfinite(t) == 0;
    const Tensor c = t.to(DType::kFloat32).contiguous();
    const float* p = c.data<float>();
    for (int64_t i = 0; i < c.numel(); ++i)
      if (!std::isfinite(p[i])) return false;
    return true;
  };
  if (!finite(mean) || !finite(variance)) {
    ++skipped_moving_updates_;
    return;
  }
  update_moving(moving_mean_, mean);
  update_moving(moving_variance_, variance);
}

void BatchNormalization::update_moving(Var& moving, const Tensor& batch) {
  const Tensor old = moving.value().to(DType::kFloat32);
  if (!old.device().is_cpu()) {
    // The loop below as two products and a sum, each rounded to float32 as there: the same bits.
    moving.set_value(ops::add(ops::scale(old, momentum_), ops::scale(batch.to(DType::kFloat32), 1.0f - momentum_)));
    return;
  }
  Tensor next = Tensor::empty(old.shape(), DType::kFloat32);
  const float* o = old.data<float>();
  const float* b = batch.data<float>();
  float* n = next.data<float>();
  for (int64_t i = 0; i < next.numel(); ++i) n[i] = o[i] * momentum_ + b[i] * (1.0f - momentum_);
  moving.set_value(next);  // converted to the variable dtype; bumps the version
}

Var BatchNormalization::call_synchronized(const Var& x, const Var& gamma, const Var& beta, Communicator& comm) {
  const int64_t C = gamma.shape()[0];
  const Tensor xf = x.value().to(DType::kFloat32).contiguous();  // read as (rows, C)
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
  update_moving_statistics(mean_t, var_t);  // the same on every rank: the statistics are global

  const bool rec = should_record({&x, &gamma, &beta});
  Var y(ops::batch_norm(x.value(), mean_t, var_t, gamma.value(), beta.value(), epsilon_), rec);
  if (!rec) return y;
  const float eps = epsilon_;
  Communicator* c_ptr = &comm;
  record_backward(y, [x, gamma, beta, y, xf, mean_t, var_t, eps, C, rows, total, c_ptr]() {
    // dy is this rank's loss gradient; the gradient all-reduce later weighs this rank by share = rows / total.
    // The global loss's dy on these rows is share * dy, so the global per-channel sums are
    // T = sum over ranks of share * (sum dy, sum dy * xhat), and this rank's input gradient, in its own scale, is
    //   dx = gamma * rstd * (dy - (T_dy + xhat * T_dyxhat) / rows).
    const Tensor dyf = y.grad().to(DType::kFloat32).contiguous();
    const float* dy = dyf.data<float>();
    const float* xv = xf.data<float>();
    const float* m = mean_t.data<float>();
    const Tensor gf = gamma.value().to(DType::kFloat32);
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
      xv_var.accumulate_grad_owned(x.dtype() == DType::kFloat32 ? dx : dx.to(x.dtype()));
    }
    if (gamma.requires_grad()) Var(gamma).accumulate_grad_owned(dgamma);
    if (beta.requires_grad()) Var(beta).accumulate_grad_owned(dbeta);
  });
  return y;
}

}  // namespace mixtrain
