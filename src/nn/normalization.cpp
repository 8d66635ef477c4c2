#include "mixtrain/nn/normalization.h"

#include <utility>
#include <vector>

#include "mixtrain/autograd/remat.h"
#include "mixtrain/distributed/data_parallel.h"
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
  rows_per_sample_ = 1;
  for (int d = 0; d + 1 < input_shape.rank(); ++d) rows_per_sample_ *= input_shape[d];
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
  // A recomputation (RematScope) sees the batch the first run saw and already counted.
  if (in_recomputation()) return;
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

// The global batch's per-channel sums times 1 / total, from this rank's sums: reduced where they live, as gradients
// are (distributed/data_parallel.h): on the GPU by a communicator that moves its memory (NCCL), else through host copies of
// their C values.
Tensor global_mean(Tensor local_sums, Communicator& comm, float inv_total) {
  std::vector<Tensor> sums{std::move(local_sums)};
  all_reduce_gradients(sums, comm, 1.0f);
  return ops::scale(sums[0], inv_total);
}

// The backward pass's two per-channel sums over the global batch, T_dy and T_dyxhat, from this rank's (each weighted
// by its share of the rows): both in one all-reduce, as rows 0 and 1 of a (2, C) buffer where they live.
std::pair<Tensor, Tensor> global_gradient_sums(const Tensor& sum_dy, const Tensor& sum_dy_xhat, Communicator& comm,
                                               float share) {
  const int64_t C = sum_dy.numel();
  std::vector<Tensor> both{Tensor::empty({2, C}, DType::kFloat32, sum_dy.device())};
  both[0].slice(0, 0, 1).copy_from(sum_dy.reshape({1, C}));
  both[0].slice(0, 1, 2).copy_from(sum_dy_xhat.reshape({1, C}));
  all_reduce_gradients(both, comm, share);
  return {both[0].slice(0, 0, 1).reshape({C}), both[0].slice(0, 1, 2).reshape({C})};
}

}  // namespace

double BatchNormalization::global_rows(int64_t samples, Communicator& comm) const {
  // Its samples times each sample's rows (the axes between the batch's and the channels', the same on every rank),
  // when train_step said how many samples; else this rank's rows summed on the host. Either way known without a
  // read of the device.
  if (global_batch_ > 0) {
    MIXTRAIN_CHECK(samples <= global_batch_, "BatchNormalization '" << name() << "': a shard of " << samples
                                                                    << " samples of a global batch of " << global_batch_);
    return static_cast<double>(global_batch_) * static_cast<double>(rows_per_sample_);
  }
  double total = static_cast<double>(samples * rows_per_sample_);
  comm.all_reduce(&total, 1, ReduceOp::kSum);
  return total;
}

Var BatchNormalization::call_synchronized(const Var& x, const Var& gamma, const Var& beta, Communicator& comm) {
  const int64_t C = gamma.shape()[0];
  const int64_t rows = x.value().numel() / C;
  rows_per_sample_ = x.value().dim(0) > 0 ? rows / x.value().dim(0) : rows_per_sample_;
  const double total = global_rows(x.value().dim(0), comm);
  MIXTRAIN_CHECK(total > 0, "BatchNormalization '" << name() << "': the global batch is empty");
  // batch_moments' two passes over the global batch, each rank's channel sums reduced between them: the global
  // mean, then the squared deviations about it (so a large mean does not cancel the variance), each times
  // 1 / rows as batch_moments takes it. Every op runs where x lives; one rank gives batch_moments' bits.
  const float inv_total = 1.0f / static_cast<float>(total);
  const Tensor mean = global_mean(ops::batch_channel_sums(x.value()), comm, inv_total);
  const Tensor variance = global_mean(ops::batch_channel_sums(x.value(), mean), comm, inv_total);
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
    // batch_norm_backward's with T in place of the batch's own sums. Every rank reduces them in the same order
    // (they hold the same layers), whether or not x needs a gradient.
    const Tensor& dy = y.grad();
    const ops::BatchNormGrads local = ops::batch_norm_backward(dy, x.value(), mean, variance, gamma.value(), eps,
                                                               /*batch_statistics=*/false, /*need_x=*/false);
    const auto [t_dy, t_dyxhat] = global_gradient_sums(local.dbeta, local.dgamma, *c_ptr, share);
    if (x.requires_grad()) {
      Var(x).accumulate_grad_owned(
          ops::batch_norm_input_grad(dy, x.value(), mean, variance, gamma.value(), eps, t_dy, t_dyxhat));
    }
    if (gamma.requires_grad()) Var(gamma).accumulate_grad_owned(local.dgamma);
    if (beta.requires_grad()) Var(beta).accumulate_grad_owned(local.dbeta);
  });
  return y;
}

void BatchNormalization::exchange_statistics_without_rows() {
  MIXTRAIN_CHECK(built() && communicator_ != nullptr,
                 "BatchNormalization '" << name() << "': exchange_statistics_without_rows needs a built layer and a "
                                           "communicator (Model::train_step sets one)");
  Communicator& comm = *communicator_;
  const double total = global_rows(0, comm);
  MIXTRAIN_CHECK(total > 0, "BatchNormalization '" << name() << "': the global batch is empty");
  const float inv_total = 1.0f / static_cast<float>(total);
  const Device device = gamma_.value().device();
  const int64_t C = gamma_.shape()[0];
  const Tensor mean = global_mean(ops::full({C}, DType::kFloat32, 0.0f, device), comm, inv_total);
  const Tensor variance = global_mean(ops::full({C}, DType::kFloat32, 0.0f, device), comm, inv_total);
  update_moving_statistics(mean, variance);
}

void BatchNormalization::exchange_gradient_sums_without_rows() {
  MIXTRAIN_CHECK(built() && communicator_ != nullptr,
                 "BatchNormalization '" << name() << "': exchange_gradient_sums_without_rows needs a built layer and "
                                           "a communicator (Model::train_step sets one)");
  const Tensor zeros = ops::full({gamma_.shape()[0]}, DType::kFloat32, 0.0f, gamma_.value().device());
  global_gradient_sums(zeros, zeros, *communicator_, 0.0f);
}

}  // namespace mixtrain
