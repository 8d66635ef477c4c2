#include "mixtrain/nn/normalization.h"

#include <vector>

#include "mixtrain/dist/data_parallel.h"
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

Var BatchNormalization::call_synchronized(const Var& x, const Var& gamma, const Var& beta, Communicator& comm) {
  const int64_t C = gamma.shape()[0];
  const int64_t rows = x.value().numel() / C;
  // The global batch's rows: known on the host, summed there (no read of the device).
  double total = static_cast<double>(rows);
  comm.all_reduce(&total, 1, ReduceOp::kSum);
  MIXTRAIN_CHECK(total > 0, "BatchNormalization '" << name() << "': the global batch is empty");
  // batch_moments' two passes over the global batch, each rank's channel sums reduced between them: the global
  // mean, then the squared deviations about it (so a large mean does not cancel the variance), each times
  // 1 / rows as batch_moments takes it. Every op runs where x lives; one rank gives batch_moments' bits. The sums
  // are reduced where they live, as gradients are (dist/data_parallel.h): on the GPU by a communicator that moves
  // its memory (NCCL), else through host copies of their C values.
  const float inv_total = 1.0f / static_cast<float>(total);
  const auto global_mean = [&](Tensor local_sums) {
    std::vector<Tensor> sums{std::move(local_sums)};
    all_reduce_gradients(sums, comm, 1.0f);
    return ops::scale(sums[0], inv_total);
  };
  const Tensor mean = global_mean(ops::batch_channel_sums(x.value()));
  const Tensor variance = global_mean(ops::batch_channel_sums(x.value(), mean));
  update_moving_statistics(mean, variance);  // the same on every rank: the statistics are global

  const bool rec = should_record({&x, &gamma, &beta});
  Var y(ops::batch_norm(x.value(), mean, variance, gamma.value(), beta.value(), epsilon_), rec);
  if (!rec) return y;
  const float eps = epsilon_;
  const float share = static_cast<float>(static_cast<double>(rows) / total);
  Communicator* c_ptr = &comm;
  record_backward(y, [x, gamma, beta, y, mean, variance, eps, share, c_ptr]() {
    // dy is this rank's loss gradient; the gradient all-reduce later weighs this rank by share = rows / total.
    // The global loss's dy on these rows is share * dy, so the global per-channel sums are
    // T = sum over ranks of share * (sum dy, sum dy * xhat), and this rank's input gradient, in its own scale, is
    //   dx = gamma * rstd * (dy - (T_dy + xhat * T_dyxhat) / rows),
    // batch_norm_backward's with T in place of the batch's own sums. Every rank reduces both sums in the same
    // order (they hold the same layers), whether or not x needs a gradient.
    const Tensor& dy = y.grad();
    const ops::BatchNormGrads local = ops::batch_norm_backward(dy, x.value(), mean, variance, gamma.value(), eps,
                                                               /*batch_statistics=*/false, /*need_x=*/false);
    std::vector<Tensor> global{local.dbeta.clone(), local.dgamma.clone()};  // T_dy, T_dyxhat
    all_reduce_gradients(global, *c_ptr, share);
    if (x.requires_grad()) {
      Var(x).accumulate_grad_owned(
          ops::batch_norm_input_grad(dy, x.value(), mean, variance, gamma.value(), eps, global[0], global[1]));
    }
    if (gamma.requires_grad()) Var(gamma).accumulate_grad_owned(local.dgamma);
    if (beta.requires_grad()) Var(beta).accumulate_grad_owned(local.dbeta);
  });
  return y;
}

}  // namespace mixtrain
