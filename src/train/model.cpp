#include "mixtrain/train/model.h"

#include <chrono>
#include <cmath>
#include <iostream>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/ops/losses.h"
#include "mixtrain/precision/loss_scale_optimizer.h"

namespace mixtrain {

namespace {
// Independent random streams of one seed, so that e.g. adding dropout does not change the initial weights.
enum Stream : uint64_t { kInitStream = 1, kShuffleStream = 2, kDropoutStream = 3 };

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void check_xy(const Tensor& x, const Tensor& y, const char* where) {
  MIXTRAIN_CHECK(x.defined() && y.defined() && x.rank() >= 2 && x.dim(0) == y.dim(0),
                 where << ": x " << x.describe() << " and y " << y.describe() << " must have the same number of rows");
}

Shape sample_shape_of(const Tensor& x) {
  return Shape(std::vector<int64_t>(x.shape().dims().begin() + 1, x.shape().dims().end()));
}

Tensor as_input(const Tensor& x) { return is_float(x.dtype()) ? x : x.to(DType::kFloat32); }
}  // namespace

Model::Model(std::string name, uint64_t seed)
    : Sequential(std::move(name)),
      seed_(seed),
      init_rng_(Rng::derive(seed, kInitStream)),
      shuffle_rng_(Rng::derive(seed, kShuffleStream)),
      dropout_rng_(Rng::derive(seed, kDropoutStream)) {}

void Model::compile(std::unique_ptr<Optimizer> optimizer, Loss loss, std::vector<std::string> metrics,
                    bool auto_scale_loss) {
  MIXTRAIN_CHECK(optimizer != nullptr, "compile: optimizer is null");
  bool float16_compute = false;
  for (auto& l : layers_) float16_compute = float16_compute || l->compute_dtype() == DType::kFloat16;
  const bool already_scaled = dynamic_cast<LossScaleOptimizer*>(optimizer.get()) != nullptr;
  if (auto_scale_loss && float16_compute && !already_scaled)
    optimizer = std::make_unique<LossScaleOptimizer>(std::move(optimizer));
  // A float16 output feeds float16 logits to the loss: Keras advises a float32 output layer.
  if (!layers_.empty() && layers_.back()->compute_dtype() == DType::kFloat16)
    std::cerr << "warning: the last layer '" << layers_.back()->name()
              << "' outputs float16 under a mixed policy; create it with dtype float32 "
                 "(e.g. Dense(10, \"linear\", dtype_arg(\"float32\"))) so the loss sees float32 values\n";
  optimizer_ = std::move(optimizer);
  loss_ = std::move(loss);
  track_accuracy_ = false;
  for (const std::string& m : metrics) {
    MIXTRAIN_CHECK(m == "accuracy" || m == "acc", "unknown metric '" << m << "'; valid metrics: accuracy");
    MIXTRAIN_CHECK(loss_->sparse(), "the accuracy metric needs sparse_categorical_crossentropy (class-id labels)");
    track_accuracy_ = true;
  }
}

void Model::build_for(const Shape& sample_shape) {
  if (!built()) build(sample_shape, init_rng_);
}

Logs Model::train_step(const Tensor& x, const Tensor& y) {
  MIXTRAIN_CHECK(compiled(), "train_step: call compile() before training");
  build_for(sample_shape_of(x));
  clear_tape();
  const std::vector<Var> vars = trainable_weights();
  Var out = call(Var(as_input(x)), CallContext{true, &dropout_rng_});
  Var loss = (*loss_)(out, y);
  // Scaling the seed of backward is scaling the loss: every gradient is multiplied by the scale.
  auto* scaler = dynamic_cast<LossScaleOptimizer*>(optimizer_.get());
  const float scale = scaler ? scaler->loss_scale() : 1.0f;
  backward(loss, scale);
  std::vector<Tensor> grads;
  grads.reserve(vars.size());
  for (const Var& v : vars) grads.push_back(v.has_grad() ? v.grad().to(DType::kFloat32) : Tensor());
  {
    NoGradGuard no_grad;
    optimizer_->apply(grads, vars);
  }
  for (Var v : vars) v.zero_grad();
  Logs logs{{"loss", loss.value().item()}};
  if (track_accuracy_) logs.emplace_back("accuracy", ops::sparse_categorical_accuracy(out.value(), y));
  if (scaler) logs.emplace_back("loss_scale", scale);
  return logs;
}

History Model::fit(const Tensor& x_all, const Tensor& y_all, const FitOptions& options) {
  MIXTRAIN_CHECK(compiled(), "fit: call compile() before fit()");
  check_xy(x_all, y_all, "fit");
  MIXTRAIN_CHECK(options.epochs > 0, "fit: epochs must be positive, got " << options.epochs);
  MIXTRAIN_CHECK(options.initial_epoch >= 0, "fit: initial_epoch must be >= 0, got " << options.initial_epoch);
  MIXTRAIN_CHECK(options.batch_size > 0, "fit: batch_size must be positive, got " << options.batch_size);
  MIXTRAIN_CHECK(options.validation_split >= 0 && options.validation_split < 1,
                 "fit: validation_split must be in [0, 1), got " << options.validation_split);

  Tensor x = x_all, y = y_all, val_x, val_y;
  if (options.validation_data) {
    val_x = options.validation_data->first;
    val_y = options.validation_data->second;
    check_xy(val_x, val_y, "fit validation_data");
  } else if (options.validation_split > 0) {
    const int64_t n = x_all.dim(0);
    const int64_t n_train = n - static_cast<int64_t>(std::floor(static_cast<double>(n) * options.validation_split));
    MIXTRAIN_CHECK(n_train > 0 && n_train < n, "fit: validation_split " << options.validation_split << " leaves "
                                                                         << n_train << " of " << n << " rows for training");
    x = x_all.slice_rows(0, n_train);
    y = y_all.slice_rows(0, n_train);
    val_x = x_all.slice_rows(n_train, n);
    val_y = y_all.slice_rows(n_train, n);
  }
  build_for(sample_shape_of(x));

  const int64_t n = x.dim(0);
  const int64_t steps = (n + options.batch_size - 1) / options.batch_size;
  // Batches are gathered straight into the first layer's compute dtype: its input cast would make that
  // copy anyway, and the float32 batch would never be needed.
  const DType batch_dtype = is_float(x.dtype()) && !layers_.empty() ? layers_.front()->compute_dtype() : x.dtype();
  for (Callback* cb : options.callbacks) cb->set_model(this);
  for (Callback* cb : options.callbacks) cb->on_train_begin(options.epochs, steps);
  stop_training = false;
  History history;
  Logs epoch_logs;
  for (int epoch = options.initial_epoch; epoch < options.epochs && !stop_training; ++epoch) {
    const auto epoch_start = Clock::now();
    for (Callback* cb : options.callbacks) cb->on_epoch_begin(epoch);
    std::vector<int64_t> order = options.shuffle ? shuffle_rng_.permutation(n) : std::vector<int64_t>();
    if (!options.shuffle)
      for (int64_t i = 0; i < n; ++i) order.push_back(i);
    Logs sums;
    int64_t seen = 0;
    const auto train_start = Clock::now();
    for (int64_t s = 0; s < steps && !stop_training; ++s) {
      const int64_t begin = s * options.batch_size, end = std::min(n, begin + options.batch_size);
      std::vector<int64_t> idx(order.begin() + begin, order.begin() + end);
      Logs step_logs = train_step(x.gather_rows(idx, batch_dtype), y.gather_rows(idx));
      const double rows = static_cast<double>(end - begin);
      history.step_loss.push_back(log_value(step_logs, "loss"));
      if (has_log(step_logs, "loss_scale")) history.step_loss_scale.push_back(log_value(step_logs, "loss_scale"));
      ++history.steps;
      history.samples += end - begin;
      // Running means weighted by rows, as Keras reports; the loss scale is the latest value.
      if (sums.empty())
        for (auto& [k, v] : step_logs) sums.emplace_back(k, 0.0);
      for (size_t i = 0; i < sums.size(); ++i)
        sums[i].second = sums[i].first == "loss_scale" ? step_logs[i].second : sums[i].second + step_logs[i].second * rows;
      seen += end - begin;
      Logs running;
      for (auto& [k, v] : sums) running.emplace_back(k, k == "loss_scale" ? v : v / static_cast<double>(seen));
      for (Callback* cb : options.callbacks) cb->on_train_batch_end(s + 1, running);
      epoch_logs = running;
    }
    history.train_seconds += seconds_since(train_start);
    if (val_x.defined()) {
      EvaluateResult v = evaluate(val_x, val_y, std::max<int64_t>(options.batch_size, 256));
      epoch_logs.emplace_back("val_loss", v.loss);
      if (track_accuracy_) epoch_logs.emplace_back("val_accuracy", v.accuracy);
    }
    history.epoch.push_back(epoch);
    for (auto& [k, v] : epoch_logs) history.history[k].push_back(v);
    const double secs = seconds_since(epoch_start);
    history.epoch_seconds.push_back(secs);
    for (Callback* cb : options.callbacks) cb->on_epoch_end(epoch, epoch_logs);
  }
  for (Callback* cb : options.callbacks) cb->on_train_end(epoch_logs);
  return history;
}

EvaluateResult Model::evaluate(const Tensor& x, const Tensor& y, int64_t batch_size) {
  MIXTRAIN_CHECK(compiled(), "evaluate: call compile() first");
  check_xy(x, y, "evaluate");
  MIXTRAIN_CHECK(batch_size > 0, "evaluate: batch_size must be positive");
  build_for(sample_shape_of(x));
  NoGradGuard no_grad;
  double loss_sum = 0, acc_sum = 0;
  const int64_t n = x.dim(0);
  for (int64_t begin = 0; begin < n; begin += batch_size) {
    const int64_t end = std::min(n, begin + batch_size);
    Tensor xb = x.slice_rows(begin, end), yb = y.slice_rows(begin, end);
    Var out = call(Var(as_input(xb)), CallContext{false, nullptr});
    const double rows = static_cast<double>(end - begin);
    loss_sum += (*loss_)(out, yb).value().item() * rows;
    if (track_accuracy_) acc_sum += ops::sparse_categorical_accuracy(out.value(), yb) * rows;
  }
  return {n ? loss_sum / static_cast<double>(n) : 0.0, n ? acc_sum / static_cast<double>(n) : 0.0};
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
    Var out = call(Var(as_input(x.slice_rows(begin, end))), CallContext{false, nullptr});
    const std::vector<float> v = out.value().to_floats();
    all.insert(all.end(), v.begin(), v.end());
    out_shape = out.shape();
  }
  std::vector<int64_t> dims = out_shape.rank() ? out_shape.dims() : std::vector<int64_t>{0};
  dims[0] = n;
  return Tensor::from_floats(Shape(dims), all);
}

}  // namespace mixtrain
