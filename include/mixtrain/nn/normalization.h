// BatchNormalization over the last axis, as Keras' layer: normalization is prone to overflow in 16-bit
// math, so it always computes in float32 (the batch statistics included) and rounds its output once into
// the compute dtype. Under mixed policies its variables and moving statistics are float32 (the variable
// dtype).
#pragma once

#include "mixtrain/autograd/conv_functions.h"
#include "mixtrain/distributed/communicator.h"
#include "mixtrain/nn/layer.h"

namespace mixtrain {

// BatchNormalization's optional arguments (Keras' names and defaults; LayerOptions in nn/layer.h explains them);
// synchronized is set_synchronized's (below).
struct BatchNormalizationOptions {
  float momentum = 0.99f;
  float epsilon = 1e-3f;
  bool synchronized = false;
  DTypeArg dtype = std::nullopt;
  std::string name = "";

  BatchNormalizationOptions& with_momentum(float v) { momentum = v; return *this; }
  BatchNormalizationOptions& with_epsilon(float v) { epsilon = v; return *this; }
  BatchNormalizationOptions& with_synchronized(bool v) { synchronized = v; return *this; }
  BatchNormalizationOptions& with_dtype(DTypeArg v) { dtype = std::move(v); return *this; }
  BatchNormalizationOptions& with_dtype(std::string_view policy) { dtype = dtype_arg(policy); return *this; }
  BatchNormalizationOptions& with_name(std::string v) { name = std::move(v); return *this; }
};

// Training (CallContext::training): y = gamma (x - mean_B) / sqrt(var_B + epsilon) + beta with the batch's
// mean and biased variance over every axis but the last, then, as Keras,
//   moving_mean     = moving_mean * momentum + mean_B * (1 - momentum)
//   moving_variance = moving_variance * momentum + var_B * (1 - momentum)      (var_B biased, as Keras 3)
// Inference: the same with the moving statistics. gamma (ones) and beta (zeros) are trainable;
// moving_mean (zeros) and moving_variance (ones) are non-trainable variables that no optimizer touches and
// checkpoints save.
//
// Data-parallel training (Model::fit with a Communicator): by default each rank normalizes with its own shard's
// statistics (as PyTorch DDP's BatchNorm). set_synchronized(true) (PyTorch's SyncBatchNorm): in training the mean
// and variance are those of the global batch over the ranks, and the backward pass all-reduces the two
// per-channel sums the input gradient needs, so each rank's result equals one process on the global batch (within
// float32 reduction order). Costs three all-reduces per layer per step: the mean's C values and the variance's C
// values forward (one after the other: the variance is taken about the global mean), and both backward sums in one
// of 2C values. The global batch's row count comes from Model::train_step, which knows it (else one more all-reduce,
// of one value on the host). Every op runs where the layer runs: on a GPU the sums are reduced there by a
// communicator that moves its memory (NCCL), with no wait for the device; a host communicator takes host copies of
// the C-value sums alone. Outside data-parallel training the option changes nothing.
class BatchNormalization : public Layer {
 public:
  explicit BatchNormalization(float momentum = 0.99f, float epsilon = 1e-3f, DTypeArg dtype = std::nullopt,
                              const std::string& name = {});
  explicit BatchNormalization(const BatchNormalizationOptions& o)
      : BatchNormalization(o.momentum, o.epsilon, o.dtype, o.name) {
    set_synchronized(o.synchronized);
  }
  // Global-batch statistics in data-parallel training (see above); returns the layer, for chaining.
  BatchNormalization& set_synchronized(bool synchronized) {
    synchronized_ = synchronized;
    return *this;
  }
  bool synchronized() const { return synchronized_; }
  // The ranks a synchronized layer reduces over in its next training call (Model::train_step sets it each step;
  // null or one rank: local statistics), and the samples of the global batch they hold together (0: unknown, then
  // counted by an all-reduce). Not owned.
  void set_communicator(Communicator* comm, int64_t global_batch = 0) {
    communicator_ = comm;
    global_batch_ = global_batch;
  }
  // A rank without samples in a step where the others train (a small last batch leaves fewer samples than ranks):
  // it takes part in a synchronized layer's exchanges as its call and backward pass would, with zero sums, so no
  // rank waits for it, and takes the global batch's statistics into its moving statistics as the others do.
  // Model::train_step calls the first in layer order, the second in reverse where the backward pass reaches the layer.
  void exchange_statistics_without_rows();
  void exchange_gradient_sums_without_rows();
  std::string class_name() const override { return "BatchNormalization"; }
  Json get_config() const override;
  // Its parameters stay float32 inside call (Keras: autocast=False), so the normalization runs in float32.
  bool autocasts_variables() const override { return false; }
  float momentum() const { return momentum_; }
  float epsilon() const { return epsilon_; }
  const Var& gamma() const { return gamma_; }
  const Var& beta() const { return beta_; }
  const Var& moving_mean() const { return moving_mean_; }
  const Var& moving_variance() const { return moving_variance_; }
  // Training batches whose statistics were not finite, so the moving statistics skipped them (see
  // update_moving_statistics); counted since construction, on the layer's device (read back when asked).
  int64_t skipped_moving_updates() const;

 protected:
  void build_impl(const Shape& input_shape, Rng& rng) override;
  Var call(const Var& x, const CallContext& ctx) override;

 private:
  // Both moving statistics from one training batch's float32 mean and variance, unless either holds a
  // non-finite value: a float16 overflow in the forward pass gives such a batch, the loss-scale optimizer then
  // skips the step's update, and this update (which no optimizer makes) must be skipped with it, or every later
  // inference reads NaN and recovery can only go back to a checkpoint from before it. Decided where the statistics
  // live (ops::update_moving_statistics): a training step on a GPU does not wait to read them.
  void update_moving_statistics(const Tensor& mean, const Tensor& variance);
  // Training with the global batch's statistics over communicator_ (synchronized_).
  Var call_synchronized(const Var& x, const Var& gamma, const Var& beta, Communicator& comm);
  // The global batch's rows (its samples times rows_per_sample_) when this rank holds `samples` samples.
  double global_rows(int64_t samples, Communicator& comm) const;

  float momentum_;
  float epsilon_;
  bool synchronized_ = false;
  Communicator* communicator_ = nullptr;
  int64_t global_batch_ = 0;
  int64_t rows_per_sample_ = 1;  // normalized rows in one sample (e.g. height x width): from build, then each call
  Var gamma_, beta_, moving_mean_, moving_variance_;
  Tensor skipped_moving_updates_;  // float32 (1,) count on the statistics' device, made at the first update
};

}  // namespace mixtrain
