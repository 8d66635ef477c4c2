#include "mixtrain/train/run.h"

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <ostream>

#include "mixtrain/core/allocator.h"
#include "mixtrain/core/json.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/precision/loss_scale_optimizer.h"
#include "mixtrain/train/checkpoint.h"
#include "mixtrain/train/model_registry.h"

namespace mixtrain {

void validate_run_config(const RunConfig& cfg) {
  model_description(cfg.model);  // throws with the valid names
  DTypePolicy::from_name(cfg.policy);  // throws with the valid names
  MIXTRAIN_CHECK(cfg.epochs > 0, "--epochs must be a positive integer, got " << cfg.epochs);
  MIXTRAIN_CHECK(cfg.batch_size > 0, "--batch-size must be a positive integer, got " << cfg.batch_size);
  MIXTRAIN_CHECK(cfg.learning_rate > 0, "--lr must be positive, got " << cfg.learning_rate);
  MIXTRAIN_CHECK(cfg.validation_split >= 0 && cfg.validation_split < 1,
                 "--validation-split must be in [0, 1), got " << cfg.validation_split);
  for (int64_t h : cfg.hidden) MIXTRAIN_CHECK(h > 0, "--hidden sizes must be positive, got " << h);
  make_optimizer(cfg.optimizer, cfg.learning_rate);  // throws with the valid names
  if (cfg.loss_scale != "dynamic" && cfg.loss_scale != "none") {
    char* end = nullptr;
    const double v = std::strtod(cfg.loss_scale.c_str(), &end);
    MIXTRAIN_CHECK(end && *end == '\0' && v > 0 && std::isfinite(v),
                   "--loss-scale must be dynamic, none or a positive number, got '" << cfg.loss_scale << "'");
  }
}

std::unique_ptr<Model> build_model(const RunConfig& cfg, int64_t num_features, int64_t num_classes,
                                   const std::vector<int64_t>& sample_shape) {
  validate_run_config(cfg);
  // The policy applies to layers created while it is global, as in Keras; the previous one is restored.
  const DTypePolicy previous = global_policy();
  set_global_policy(cfg.policy);
  std::unique_ptr<Model> model;
  try {
    model = make_registered_model(cfg, ModelInputSpec{num_features, sample_shape, num_classes});
  } catch (...) {
    set_global_policy(previous);
    throw;
  }
  set_global_policy(previous);
  model->build_for(Shape{num_features});
  return model;
}

RunResult run_training(const RunConfig& cfg, const DataSplits& data, std::ostream* progress, bool interactive) {
  auto model = build_model(cfg, data.train.num_features(), std::max(data.train.num_classes, data.test.num_classes),
                           data.train.sample_shape);
  std::unique_ptr<Optimizer> opt = make_optimizer(cfg.optimizer, cfg.learning_rate);
  const bool float16_compute = DTypePolicy::from_name(cfg.policy).compute_dtype() == DType::kFloat16;
  bool auto_scale = true;
  if (float16_compute && cfg.loss_scale == "none") auto_scale = false;
  if (float16_compute && cfg.loss_scale != "dynamic" && cfg.loss_scale != "none") {
    LossScaleOptions o;
    o.dynamic = false;
    o.initial_scale = std::strtof(cfg.loss_scale.c_str(), nullptr);
    opt = std::make_unique<LossScaleOptimizer>(std::move(opt), o);
  }
  model->compile(std::move(opt), Loss("sparse_categorical_crossentropy", /*from_logits=*/true), {"accuracy"},
                 auto_scale);
  std::optional<LossScaleReport> scaler = model->optimizer().loss_scale_report();

  RunResult r;
  r.compute_dtype = dtype_name(DTypePolicy::from_name(cfg.policy).compute_dtype());
  if (scaler) {
    r.loss_scaled = true;
    r.initial_scale = scaler->scale;
  }
  if (progress) model->summary(*progress);
  ProgressBarLogger bar(progress ? *progress : std::cout, interactive);
  TerminateOnNaN nan_guard;
  FitOptions fo;
  fo.epochs = cfg.epochs;
  fo.batch_size = cfg.batch_size;
  // The recovery ladder handles non-finite steps itself; without it a NaN loss ends training (Keras' TerminateOnNaN).
  if (!cfg.recover) fo.callbacks.push_back(&nan_guard);
  if (progress) fo.callbacks.push_back(&bar);
  // Split off the validation rows (the last ones, as Keras) before measuring, so the peak counts what
  // training holds (batches, activations, gradients, optimizer state), not copies of the data set.
  ValidationSplit split = split_validation(data.train.x, data.train.y, cfg.validation_split);
  if (split.val_x.defined()) fo.validation_data = std::make_pair(split.val_x, split.val_y);

  if (!cfg.resume_path.empty()) {
    const CheckpointInfo info = load_checkpoint(cfg.resume_path, *model);
    fo.initial_epoch = std::min(info.epoch, cfg.epochs);
    r.initial_epoch = fo.initial_epoch;
    if (progress)
      *progress << "resumed from " << cfg.resume_path << " after epoch " << info.epoch << " of " << cfg.epochs << "\n";
  }
  std::unique_ptr<CheckpointCallback> saver;
  if (!cfg.save_path.empty()) {
    saver = std::make_unique<CheckpointCallback>(cfg.save_path, 1, run_config_json(cfg));
    fo.callbacks.push_back(saver.get());
  }
  RecoveryOptions ro;
  ro.log = progress;
  ro.reference_step_loss = cfg.reference_step_loss;
  RecoveryGuard guard(ro);
  if (cfg.recover) fo.recovery = &guard;

  const int64_t live_before = memory_stats().live_bytes;
  reset_peak_memory();
  r.history = model->fit(split.x, split.y, fo);
  r.peak_memory_bytes = memory_stats().peak_bytes - live_before;
  r.test = model->evaluate(data.test.x, data.test.y);
  const double secs = r.history.train_seconds;
  r.steps_per_second = secs > 0 ? static_cast<double>(r.history.steps) / secs : 0;
  r.samples_per_second = secs > 0 ? static_cast<double>(r.history.samples) / secs : 0;
  r.recovery = guard.events();
  for (auto& l : model->layers()) r.layer_compute_dtypes.emplace_back(l->name(), dtype_name(l->compute_dtype()));
  // Recovery may have switched loss scaling on during training.
  scaler = model->optimizer().loss_scale_report();
  if (scaler && !r.loss_scaled) {
    r.loss_scaled = true;
    r.initial_scale = LossScaleOptions{}.initial_scale;
  }
  if (scaler) {
    r.final_scale = scaler->scale;
    r.min_scale_seen = scaler->min_scale_seen;
    r.skipped_steps = scaler->skipped_steps;
  }
  return r;
}

std::string run_config_json(const RunConfig& cfg) {
  Json j = Json::object();
  j["model"] = cfg.model;
  Json hidden = Json::array();
  for (int64_t h : cfg.hidden) hidden.push_back(h);
  j["hidden"] = hidden;
  j["policy"] = cfg.policy;
  j["epochs"] = cfg.epochs;
  j["batch_size"] = cfg.batch_size;
  j["learning_rate"] = cfg.learning_rate;
  j["optimizer"] = cfg.optimizer;
  j["seed"] = static_cast<double>(cfg.seed);
  j["validation_split"] = cfg.validation_split;
  j["loss_scale"] = cfg.loss_scale;
  j["recover"] = cfg.recover;
  return j.dump();
}

}  // namespace mixtrain
