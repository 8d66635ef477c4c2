#include "mixtrain/train/model.h"

#include <cmath>
#include <iostream>
#include <utility>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/distributed/data_parallel.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/losses.h"
#include "mixtrain/ops/transfer.h"
#include "mixtrain/precision/loss_scale_optimizer.h"
#include "mixtrain/report/progress_bar.h"
#include "model_detail.h"

namespace mixtrain {

using detail::as_input;
using detail::check_xy;
using detail::kDropoutStream;
using detail::kInitStream;
using detail::kShuffleStream;
using detail::on_device;
using detail::sample_shape_of;

int64_t training_rows(int64_t n, double fraction) {
  MIXTRAIN_CHECK(fraction >= 0 && fraction < 1, "validation_split must be in [0, 1), got " << fraction);
  const int64_t n_train = n - static_cast<int64_t>(std::floor(static_cast<double>(n) * fraction));
  MIXTRAIN_CHECK(n_train > 0 && (fraction == 0 || n_train < n),
                 "validation_split " << fraction << " leaves " << n_train << " of " << n << " rows for training");
  return n_train;
}

ValidationSplit split_validation(const Tensor& x, const Tensor& y, double fraction) {
  const int64_t n = x.dim(0), n_train = training_rows(n, fraction);
  if (n_train == n) return {x, y, Tensor(), Tensor()};
  return {x.slice_rows(0, n_train), y.slice_rows(0, n_train), x.slice_rows(n_train, n), y.slice_rows(n_train, n)};
}

Model::Model(std::string name, uint64_t seed)
    : Network(std::move(name)),
      seed_(seed),
      init_rng_(Rng::derive(seed, kInitStream)),
      shuffle_rng_(Rng::derive(seed, kShuffleStream)),
      dropout_rng_(Rng::derive(seed, kDropoutStream)) {}

Model::Model(std::vector<std::shared_ptr<Layer>> layers, const Shape& input_shape, std::string name, uint64_t seed)
    : Model(std::move(name), seed) {
  for (std::shared_ptr<Layer>& l : layers) add(std::move(l));
  if (input_shape.rank() > 0) build_for(input_shape);
}

Model::Model(std::vector<SymbolicTensor> inputs, std::vector<SymbolicTensor> outputs, std::string name, uint64_t seed)
    : Network(std::move(inputs), std::move(outputs), std::move(name)),
      seed_(seed),
      init_rng_(Rng::derive(seed, kInitStream)),
      shuffle_rng_(Rng::derive(seed, kShuffleStream)),
      dropout_rng_(Rng::derive(seed, kDropoutStream)) {
  // The graph knows every shape: build now, as Keras does, so summary() and weights() are complete.
  build_for(input_shape());
}

void Model::compile(std::unique_ptr<Optimizer> optimizer, Loss loss, std::vector<std::string> metrics,
                    bool auto_scale_loss) {
  // A null optimizer compiles for evaluation only (Keras' compile(loss=, metrics=)): fit() names what is missing.
  bool float16_compute = false;
  for (auto& l : layers_) float16_compute = float16_compute || l->compute_dtype() == DType::kFloat16;
  if (optimizer && auto_scale_loss && float16_compute && !optimizer->scales_loss())
    optimizer = std::make_unique<LossScaleOptimizer>(std::move(optimizer));
  // A float16 output feeds float16 logits to the loss: Keras advises a float32 output layer.
  for (const Layer* out : output_layers())
    if (out->compute_dtype() == DType::kFloat16)
      std::cerr << "warning: the output layer '" << out->name()
                << "' outputs float16 under a mixed policy; create it with dtype float32 "
                   "(e.g. Dense(10, \"linear\", dtype_arg(\"float32\"))) so the loss sees float32 values\n";
  optimizer_ = std::move(optimizer);
  loss_ = std::move(loss);
  track_accuracy_ = track_top_k_ = false;
  metric_slots_.clear();
  for (const std::string& m : metrics) {
    const bool accuracy = m == "accuracy" || m == "acc" || m == "sparse_categorical_accuracy";
    const bool top_k = m == "sparse_top_k_categorical_accuracy";
    MIXTRAIN_CHECK(accuracy || top_k, "compile: unknown metric '" << m << "'; valid metrics: accuracy (acc), "
                                      "sparse_categorical_accuracy, sparse_top_k_categorical_accuracy");
    MIXTRAIN_CHECK(loss_->sparse(), "compile: the metric '" << m << "' needs sparse_categorical_crossentropy (class-id "
                                                               "labels)");
    MIXTRAIN_CHECK(!(accuracy ? track_accuracy_ : track_top_k_),
                   "compile: the metric '" << m << "' is given twice (accuracy, acc and sparse_categorical_accuracy "
                                              "are one count)");
    (accuracy ? track_accuracy_ : track_top_k_) = true;
    // Logged under the name given, as Keras, except "acc", which has always logged as "accuracy".
    metric_slots_.emplace_back(m == "acc" ? "accuracy" : m, accuracy ? 1 : kTopKSlot);
  }
}

std::vector<std::string> Model::compiled_metrics() const {
  std::vector<std::string> names;
  for (const auto& [name, slot] : metric_slots_) names.push_back(name);
  return names;
}

void Model::enable_dynamic_loss_scaling() {
  MIXTRAIN_CHECK(compiled(), "enable_dynamic_loss_scaling: compile the model first");
  if (!optimizer_->scales_loss()) optimizer_ = std::make_unique<LossScaleOptimizer>(std::move(optimizer_));
}

void Model::build_for(const Shape& sample_shape) {
  if (!built()) build(sample_shape, init_rng_);
}

EvaluateResult Model::evaluate(const Tensor& x, const Tensor& y, int64_t batch_size, Communicator* comm) {
  return evaluate_batches(x, y, batch_size, comm);
}

EvaluateResult Model::evaluate(const Tensor& x, const Tensor& y, const EvaluateOptions& options) {
  MIXTRAIN_CHECK(options.verbose == 0 || options.verbose == 1,
                 "evaluate: verbose must be 0 (silent) or 1 (a summary line), got " << options.verbose);
  EvaluateResult r = evaluate_batches(x, y, options.batch_size, options.communicator);
  const Communicator* comm = options.communicator;
  if (options.verbose == 1 && (!comm || comm->rank() == 0)) {
    // Keras' closing line of evaluate: the loss then each metric, " - " between them.
    std::ostream& out = options.verbose_out ? *options.verbose_out : std::cout;
    out << "loss: " << format_metric_value(r.loss);
    for (const auto& [name, value] : r.metrics) out << " - " << name << ": " << format_metric_value(value);
    out << "\n" << std::flush;
  }
  return r;
}

EvaluateResult Model::evaluate_batches(const Tensor& x, const Tensor& y, int64_t batch_size, Communicator* comm) {
  MIXTRAIN_CHECK(compiled_for_evaluation(), "evaluate: call compile() first");
  check_xy(x, y, "evaluate");
  MIXTRAIN_CHECK(batch_size > 0, "evaluate: batch_size must be positive");
  build_for(sample_shape_of(x));
  NoGradGuard no_grad;
  const int64_t n = x.dim(0);
  if (comm && comm->size() == 1) comm = nullptr;
  const ShardRange mine = comm ? shard_range(n, comm->rank(), comm->size()) : ShardRange{0, n};
  // Each batch's mean loss and metric counts stay where they were computed, a row per batch, until every batch is
  // queued: on a GPU the batches run back to back and the host reads once, not twice a batch. The sums are then the
  // ones a read per batch gives (float32 loss, accuracy as correct / scored rows, weighted by the batch's rows).
  // Row: (loss, arg-max correct, in the top k).
  const int64_t batches = (mine.end - mine.begin + batch_size - 1) / batch_size;
  Tensor logs = ops::full({std::max<int64_t>(batches, 1), 3}, DType::kFloat32, 0.0f, device());
  std::vector<std::pair<double, double>> rows_of;  // (the batch's samples, its scored rows)
  for (int64_t begin = mine.begin, i = 0; begin < mine.end; begin += batch_size, ++i) {
    const int64_t end = std::min(mine.end, begin + batch_size);
    Tensor xb = on_device(x.slice_rows(begin, end), device()), yb = on_device(y.slice_rows(begin, end), device());
    const ForwardLoss f = forward_loss(xb, yb, CallContext{false, nullptr}, Tensor());
    Tensor row = logs.slice(0, i, i + 1).reshape({3});
    row.slice(0, 0, 1).copy_from(f.loss.value().reshape({1}));
    if (track_accuracy_) row.slice(0, 1, 2).copy_from(f.correct);
    if (track_top_k_) row.slice(0, 2, 3).copy_from(ops::count_in_top_k(f.out.value(), yb, kDefaultTopK));
    rows_of.emplace_back(static_cast<double>(end - begin), static_cast<double>(f.scored));
  }
  const Tensor host_logs = ops::to_device(logs, Device::cpu());
  const float* l = host_logs.data<float>();
  double sums[3] = {0, 0, 0};  // loss, accuracy, top-k accuracy, each weighted by the batch's rows
  for (size_t i = 0; i < rows_of.size(); ++i) {
    const auto [rows, scored] = rows_of[i];
    sums[0] += static_cast<double>(l[3 * i]) * rows;
    for (int j = 1; j < 3; ++j) sums[j] += (scored > 0 ? static_cast<double>(l[3 * i + j]) / scored : 0.0) * rows;
  }
  if (comm) comm->all_reduce(sums, 3, ReduceOp::kSum);
  for (double& v : sums) v = n ? v / static_cast<double>(n) : 0.0;
  EvaluateResult r{sums[0], track_accuracy_ ? sums[1] : 0.0, {}};
  for (const auto& [name, slot] : metric_slots_) r.metrics.emplace_back(name, slot == 1 ? sums[1] : sums[2]);
  return r;
}

Tensor Model::predict(const Tensor& x, int64_t batch_size) {
  MIXTRAIN_CHECK(x.defined() && x.rank() >= 2, "predict: x must have a batch dimension, got " << x.describe());
  MIXTRAIN_CHECK(batch_size > 0, "predict: batch_size must be positive");
  build_for(sample_shape_of(x));
  NoGradGuard no_grad;
  const int64_t n = x.dim(0);
  std::vector<float> all;
  Shape out_shape;
  for (int64_t begin = 0; begin < n; begin += batch_size) {
    const int64_t end = std::min(n, begin + batch_size);
    Var out = call(Var(as_input(on_device(x.slice_rows(begin, end), device()))), CallContext{false, nullptr});
    const std::vector<float> v = on_device(out.value(), Device::cpu()).to_floats();
    all.insert(all.end(), v.begin(), v.end());
    out_shape = out.shape();
  }
  std::vector<int64_t> dims = out_shape.rank() ? out_shape.dims() : std::vector<int64_t>{0};
  dims[0] = n;
  return Tensor::from_floats(Shape(dims), all);
}

}  // namespace mixtrain
