#include "mixtrain/train/run.h"

#include <cmath>
#include <cstdlib>
#include <map>
#include <iostream>
#include <optional>
#include <sstream>
#include <ostream>

#include "mixtrain/core/allocator.h"
#include "mixtrain/core/base64.h"
#include "mixtrain/core/json.h"
#include "mixtrain/distributed/communicator.h"
#include "mixtrain/io/safetensors.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/normalization.h"
#include "mixtrain/optim/adam.h"
#include "mixtrain/optim/schedules.h"
#include "mixtrain/precision/fp8_gemm_scales.h"
#include "mixtrain/precision/loss_scale_optimizer.h"
#include "mixtrain/train/checkpoint.h"
#include "mixtrain/train/mlp_outliers.h"
#include "mixtrain/train/model_registry.h"
#include "mixtrain/train/transformer_model.h"

namespace mixtrain {

namespace {
// --master-rounding and --optimizer-state: stochastic rounding is Adam's and AdamW's, of bfloat16 variables or
// bfloat16 moments; Kahan compensation Adam's and AdamW's, of bfloat16 variables; bfloat16 moments are Adam's and
// AdamW's.
void check_master_rounding(const RunConfig& cfg) {
  MIXTRAIN_CHECK(cfg.master_rounding == "nearest" || cfg.master_rounding == "stochastic" ||
                     cfg.master_rounding == "kahan",
                 "--master-rounding must be nearest, stochastic or kahan, got '" << cfg.master_rounding << "'");
  MIXTRAIN_CHECK(cfg.optimizer_state == "float32" || cfg.optimizer_state == "bfloat16",
                 "--optimizer-state must be float32 or bfloat16, got '" << cfg.optimizer_state << "'");
  const bool bfloat16_state = cfg.optimizer_state == "bfloat16";
  MIXTRAIN_CHECK(!bfloat16_state || cfg.optimizer == "adam" || cfg.optimizer == "adamw",
                 "--optimizer-state bfloat16 keeps Adam's moments; it needs --optimizer adam or adamw, got "
                     << cfg.optimizer);
  if (cfg.master_rounding == "nearest") return;
  const DType variables = DTypePolicy::from_name(cfg.policy).variable_dtype();
  MIXTRAIN_CHECK(cfg.master_rounding != "kahan" || variables == DType::kBFloat16,
                 "--master-rounding kahan compensates bfloat16 master weights; --policy "
                     << cfg.policy << " keeps the weights in " << dtype_name(variables) << " (use --policy bfloat16)");
  MIXTRAIN_CHECK(bfloat16_state || DTypePolicy::from_name(cfg.policy).variable_dtype() == DType::kBFloat16,
                 "--master-rounding stochastic rounds bfloat16 master weights or optimizer state; --policy "
                     << cfg.policy << " keeps the weights in "
                     << dtype_name(DTypePolicy::from_name(cfg.policy).variable_dtype())
                     << " (use --policy bfloat16 or --optimizer-state bfloat16)");
  MIXTRAIN_CHECK(cfg.optimizer == "adam" || cfg.optimizer == "adamw",
                 "--master-rounding " << cfg.master_rounding << " needs --optimizer adam or adamw, got "
                                      << cfg.optimizer);
}
}  // namespace

void validate_run_config(const RunConfig& cfg) {
  model_description(cfg.model);  // throws with the valid names
  DTypePolicy::from_name(cfg.policy);  // throws with the valid names
  parse_fp8_recipe(cfg.fp8_recipe);    // likewise
  MIXTRAIN_CHECK(cfg.epochs > 0, "--epochs must be a positive integer, got " << cfg.epochs);
  MIXTRAIN_CHECK(cfg.batch_size > 0, "--batch-size must be a positive integer, got " << cfg.batch_size);
  MIXTRAIN_CHECK(cfg.learning_rate > 0, "--lr must be positive, got " << cfg.learning_rate);
  MIXTRAIN_CHECK(cfg.validation_split >= 0 && cfg.validation_split < 1,
                 "--validation-split must be in [0, 1), got " << cfg.validation_split);
  for (int64_t h : cfg.hidden) MIXTRAIN_CHECK(h > 0, "--hidden sizes must be positive, got " << h);
  MIXTRAIN_CHECK(cfg.steps >= 0, "--steps must be a positive integer, got " << cfg.steps);
  MIXTRAIN_CHECK(cfg.save_every >= 0, "--save-every must be a positive integer, got " << cfg.save_every);
  MIXTRAIN_CHECK(cfg.eval_interval >= 0, "--eval-every must be a positive integer, got " << cfg.eval_interval);
  MIXTRAIN_CHECK(cfg.warmup_steps >= 0 || cfg.warmup_steps == RunConfig::kAutoWarmup,
                 "--warmup-steps must be >= 0, got " << cfg.warmup_steps);
  MIXTRAIN_CHECK(cfg.weight_decay >= 0, "--weight-decay must be >= 0, got " << cfg.weight_decay);
  MIXTRAIN_CHECK(cfg.clipnorm >= 0, "--clipnorm must be >= 0 (0: no clipping), got " << cfg.clipnorm);
  MIXTRAIN_CHECK(cfg.zero_stage == 0 || cfg.zero_stage == 1,
                 "--zero must be 0 or 1 (the ZeRO stage: 1 splits the optimizer state across the MPI ranks), got "
                     << cfg.zero_stage);
  MIXTRAIN_CHECK(cfg.zero_stage == 0 || cfg.master_rounding == "nearest",
                 "--zero 1 does not shard --master-rounding " << cfg.master_rounding
                     << " (it shards the moments only); use --master-rounding nearest");
  MIXTRAIN_CHECK(cfg.grad_comm == "float32" || cfg.grad_comm == "bfloat16",
                 "--grad-comm must be float32 or bfloat16 (the dtype gradients travel in between the ranks), got '"
                     << cfg.grad_comm << "'");
  MIXTRAIN_CHECK(cfg.grad_comm == "float32" || cfg.device.is_cpu(),
                 "--grad-comm bfloat16 runs on the CPU (MPI moves host memory; NCCL's exchange is float32), not on --device "
                     << cfg.device.str());
  MIXTRAIN_CHECK(cfg.gradient_accumulation_steps >= 1 && cfg.gradient_accumulation_steps <= cfg.batch_size,
                 "--accumulate must be in [1, --batch-size " << cfg.batch_size << "] (micro-batches per batch), got "
                                                             << cfg.gradient_accumulation_steps);
  MIXTRAIN_CHECK(cfg.context_length > 0 && cfg.context_length <= 65536,
                 "--context must be in [1, 65536], got " << cfg.context_length);
  MIXTRAIN_CHECK(cfg.width > 0 && cfg.width <= 65536, "--width must be in [1, 65536], got " << cfg.width);
  MIXTRAIN_CHECK(cfg.num_layers > 0 && cfg.num_layers <= 1024, "--layers must be in [1, 1024], got " << cfg.num_layers);
  MIXTRAIN_CHECK(cfg.num_heads > 0 && cfg.width % cfg.num_heads == 0,
                 "--heads must be positive and divide --width " << cfg.width << ", got " << cfg.num_heads);
  MIXTRAIN_CHECK(cfg.dropout >= 0 && cfg.dropout < 1, "--dropout must be in [0, 1), got " << cfg.dropout);
  MIXTRAIN_CHECK(cfg.attention_logit_multiplier > 0, "the attention logit multiplier must be positive");
  check_transformer_blocks(cfg.norm, cfg.mlp, cfg.positions);
  MIXTRAIN_CHECK(cfg.attention == "tiled" || cfg.attention == "full",
                 "--attention must be tiled or full, got '" << cfg.attention << "'");
  check_remat(cfg.remat);
  MIXTRAIN_CHECK(cfg.mlp_outliers_from >= -1, "--mlp-outliers must be a step >= 0, got " << cfg.mlp_outliers_from);
  MIXTRAIN_CHECK(cfg.mlp_outliers_log2 >= 1 && cfg.mlp_outliers_log2 <= kMlpOutlierMaxLog2,
                 "--mlp-outliers STEP:LOG2: LOG2 must be 1 to 24, got " << cfg.mlp_outliers_log2);
  MIXTRAIN_CHECK(cfg.mlp_outliers_rise >= 0 && cfg.mlp_outliers_rise <= cfg.mlp_outliers_log2,
                 "--mlp-outliers STEP:LOG2:RISE: RISE must be 1 to LOG2, got " << cfg.mlp_outliers_rise);
  MIXTRAIN_CHECK(cfg.mlp_outliers_from < 0 || (cfg.model == "transformer" && cfg.mlp == "gelu"),
                 "--mlp-outliers (a test switch) applies to --model transformer with --mlp gelu only");
  MIXTRAIN_CHECK(cfg.remat == "none" || cfg.model == "transformer" || cfg.model == "resnet",
                 "--remat applies to --model transformer and resnet only, got --model " << cfg.model);
  // A recomputed synchronized BatchNormalization all-reduces its statistics again, which a rank without rows in
  // the batch (it exchanges zeros once) would not match.
  MIXTRAIN_CHECK(cfg.remat != "activations" || (cfg.model == "transformer" && cfg.mlp == "gelu" &&
                                                 cfg.mlp_outliers_from < 0),
                 "--remat activations makes the GELU MLP's hidden values again: it needs --model transformer with "
                 "--mlp gelu (and no --mlp-outliers)");
  MIXTRAIN_CHECK(cfg.remat != "blocks" || !cfg.synchronized_batch_norm,
                 "--remat blocks does not work with --sync-batch-norm yet; use one or the other");
  make_optimizer(cfg.optimizer, cfg.learning_rate);  // throws with the valid names
  check_master_rounding(cfg);
  const int64_t warmup = std::max<int64_t>(cfg.warmup_steps, 0);
  make_schedule(cfg.lr_schedule, cfg.learning_rate, std::max<int64_t>(warmup, 1), warmup);
  if (cfg.loss_scale != "dynamic" && cfg.loss_scale != "none") {
    char* end = nullptr;
    const double v = std::strtod(cfg.loss_scale.c_str(), &end);
    MIXTRAIN_CHECK(end && *end == '\0' && v > 0 && std::isfinite(v),
                   "--loss-scale must be dynamic, none or a positive number, got '" << cfg.loss_scale << "'");
  }
}

namespace {

// Bytes every weight holds at least while it trains: its float32 value and gradient, the optimizer's slots (Adam's
// m and v, float32 or, with --optimizer-state bfloat16, bfloat16; RMSprop's mean square; with --zero 1 a rank holds
// 1/ranks of them) and, under a mixed policy, its 16-bit compute copy.
double bytes_per_weight(const RunConfig& cfg, bool mixed) {
  const double slots = (cfg.optimizer == "adam" || cfg.optimizer == "adamw") ? 2.0 : cfg.optimizer == "rmsprop" ? 1.0 : 0.0;
  const double slot_bytes = cfg.optimizer_state == "bfloat16" ? 2.0 : 4.0;
  const double ranks = cfg.zero_stage == 1 && cfg.communicator != nullptr ? cfg.communicator->size() : 1.0;
  return 4.0 * 2.0 + slot_bytes * slots / ranks + (mixed ? 2.0 : 0.0);
}

}  // namespace

void check_model_fits_memory(const RunConfig& cfg, const ModelInputSpec& input, int64_t batch) {
  const int64_t limit = memory_limit();
  if (limit <= 0) return;
  const std::optional<ModelSizeEstimate> e = estimate_model_size(cfg, input);
  if (!e) return;
  const bool mixed = cfg.policy.rfind("mixed_", 0) == 0;
  const double per_weight = bytes_per_weight(cfg, mixed);
  const double state = e->weights * per_weight;
  // Outputs kept for backward in the compute dtype, and the widest one's gradient.
  const double per_sample = (e->activations_per_sample + e->largest_activation_per_sample) * (mixed ? 2.0 : 4.0);
  const double need = state + static_cast<double>(batch) * per_sample;
  if (need <= static_cast<double>(limit)) return;
  std::ostringstream what, hint;
  what << "model '" << cfg.model << "' does not fit in memory: its " << std::llround(std::min(e->weights, 9e18))
       << " weights need at least " << format_bytes(state) << " for values, gradients and optimizer state";
  if (batch > 0) what << ", and " << format_bytes(per_sample) << " per sample of activations (" << batch << " per batch)";
  what << ", more than the limit of " << format_bytes(static_cast<double>(limit));
  if (state < static_cast<double>(limit) && per_sample > 0) {
    const double fit = std::floor((static_cast<double>(limit) - state) / per_sample);
    hint << "use --batch-size " << std::llround(std::max(fit, 1.0)) << " or less, or fewer or narrower layers";
  } else {
    hint << "about " << std::llround(static_cast<double>(limit) / per_weight)
         << " weights fit: use fewer or narrower layers (--hidden, --width)";
  }
  hint << "; the limit is 80% of the memory available when the run started";
  MIXTRAIN_FAIL(kInvalidInput, what.str(), hint.str());
}

namespace {

// build_model once cfg is validated and the model known to fit.
std::unique_ptr<Model> build_checked_model(const RunConfig& cfg, int64_t num_features, int64_t num_classes,
                                           const std::vector<int64_t>& sample_shape) {
  // The policy applies to layers created while it is global, as in Keras; the previous one is restored.
  // So does the FP8 recipe.
  const DTypePolicy previous = global_policy();
  const Fp8Recipe previous_recipe = fp8_recipe();
  set_global_policy(cfg.policy);
  set_fp8_recipe(parse_fp8_recipe(cfg.fp8_recipe));
  std::unique_ptr<Model> model;
  try {
    model = make_registered_model(cfg, ModelInputSpec{num_features, sample_shape, num_classes});
  } catch (...) {
    set_global_policy(previous);
    set_fp8_recipe(previous_recipe);
    throw;
  }
  set_global_policy(previous);
  set_fp8_recipe(previous_recipe);
  if (cfg.synchronized_batch_norm)
    for (const auto& layer : model->layers())
      if (auto* bn = dynamic_cast<BatchNormalization*>(layer.get())) bn->set_synchronized(true);
  model->build_for(Shape{num_features});
  return model;
}

}  // namespace

std::unique_ptr<Model> build_model(const RunConfig& cfg, int64_t num_features, int64_t num_classes,
                                   const std::vector<int64_t>& sample_shape) {
  validate_run_config(cfg);
  // Before any weight is allocated or initialized (a huge model would take minutes to fail otherwise).
  check_model_fits_memory(cfg, ModelInputSpec{num_features, sample_shape, num_classes}, 0);
  return build_checked_model(cfg, num_features, num_classes, sample_shape);
}

int64_t resolved_warmup_steps(const RunConfig& cfg, int64_t total_steps) {
  if (cfg.warmup_steps != RunConfig::kAutoWarmup) return cfg.warmup_steps;
  return std::min<int64_t>(100, total_steps / 10);
}

std::unique_ptr<Optimizer> make_run_optimizer(const RunConfig& cfg, int64_t total_steps) {
  std::unique_ptr<Optimizer> opt;
  AdamOptions adam_options;
  adam_options.stochastic_rounding = cfg.master_rounding == "stochastic";
  adam_options.kahan_summation = cfg.master_rounding == "kahan";
  adam_options.rounding_seed = cfg.seed;
  if (cfg.optimizer_state == "bfloat16") adam_options.optimizer_state = DType::kBFloat16;
  if (cfg.optimizer == "adamw") {
    // Biases and normalization parameters are not decayed (the common practice for transformers; decaying a
    // LayerNorm gain towards 0 only fights the normalization).
    opt = std::make_unique<AdamW>(cfg.learning_rate, cfg.weight_decay, adam_options,
                                  std::vector<std::string>{"bias", "gamma", "beta"});
  } else if (cfg.optimizer == "adam") {
    opt = std::make_unique<Adam>(cfg.learning_rate, adam_options);
  } else {
    opt = make_optimizer(cfg.optimizer, cfg.learning_rate);
  }
  if (cfg.clipnorm > 0) opt->set_global_clipnorm(cfg.clipnorm);
  opt->set_gradient_accumulation_steps(cfg.gradient_accumulation_steps);
  const int64_t warmup = resolved_warmup_steps(cfg, total_steps);
  if (cfg.lr_schedule != "constant" || warmup > 0)
    opt->set_learning_rate_schedule(make_schedule(cfg.lr_schedule, cfg.learning_rate, total_steps, warmup));
  return opt;
}

namespace {

// Whether the data set holds token windows (a language model): the second split is then the validation text.
bool is_sequence_data(const DataSplits& data) {
  return data.train.x.dtype() == DType::kInt32 && data.train.y.rank() == 2;
}

// Updates of the whole run, for the learning-rate schedule and the recovery ladder's timing.
int64_t run_total_steps(const RunConfig& cfg, const DataSplits& data) {
  const int64_t train_rows =
      is_sequence_data(data) ? data.train.size() : training_rows(data.train.size(), cfg.validation_split);
  return cfg.steps > 0 ? static_cast<int64_t>(cfg.fit_epochs()) * cfg.steps_per_epoch()
                       : cfg.epochs * ((train_rows + cfg.batch_size - 1) / cfg.batch_size);
}

// The run's model, built under cfg.policy on cfg.device and compiled with the run's optimizer and loss scaling.
std::unique_ptr<Model> compiled_run_model(const RunConfig& cfg, const DataSplits& data) {
  const int64_t num_classes = std::max(data.train.num_classes, data.test.num_classes);
  // The model's size is estimated once, at the batch each rank holds (its shard of the global batch); that bound
  // covers the weights-only one build_model would check.
  check_model_fits_memory(cfg, ModelInputSpec{data.train.num_features(), data.train.sample_shape, num_classes},
                          cfg.communicator != nullptr ? cfg.batch_size / cfg.communicator->size() : cfg.batch_size);
  validate_run_config(cfg);
  auto model = build_checked_model(cfg, data.train.num_features(), num_classes, data.train.sample_shape);
  model->to(cfg.device);
  std::unique_ptr<Optimizer> opt = make_run_optimizer(cfg, run_total_steps(cfg, data));
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
  return model;
}

// Loads cfg.resume_path into model and sets fo to continue from it (r.initial_epoch: where it continues).
void resume_run(const RunConfig& cfg, Model& model, FitOptions& fo, RunResult& r, std::ostream* progress) {
  CheckpointInfo info = load_checkpoint(cfg.resume_path, model);
  fo.initial_epoch = std::min(info.epoch, fo.epochs);
  r.initial_epoch = fo.initial_epoch;
  if (progress) {
    *progress << "resumed from " << cfg.resume_path << " after epoch " << info.epoch;
    if (info.fit_state && info.fit_state->step > 0)
      *progress << " and step " << info.fit_state->step << " of epoch " << info.epoch + 1;
    *progress << " of " << fo.epochs << "\n";
  }
  // A file saved during training continues at its next batch with the run's History; older files at the epoch.
  if (info.fit_state) fo.resume = std::move(info.fit_state);
}

// After fit: the test figures, speed, recovery actions, layers' compute dtypes and the loss-scale summary.
void finish_result(const RunConfig& cfg, const DataSplits& data, Model& model, const FitOptions& fo,
                   const RecoveryGuard& guard, RunResult& r) {
  const bool sequences = is_sequence_data(data);
  // A language model's test split is its validation text, just evaluated at the end of the last interval.
  const auto& val_loss = r.history.history["val_loss"];
  const auto& val_acc = r.history.history["val_accuracy"];
  if (sequences && !val_loss.empty() && !val_acc.empty() && r.history.epoch.back() == fo.epochs - 1)
    r.test = {val_loss.back(), val_acc.back(), {{"accuracy", val_acc.back()}}};
  else
    r.test = model.evaluate(data.test.x, data.test.y,
                            fo.validation_rows_at_once(cfg.communicator ? cfg.communicator->size() : 1),
                            cfg.communicator);
  const double secs = r.history.train_seconds;
  r.steps_per_second = secs > 0 ? static_cast<double>(r.history.steps) / secs : 0;
  r.samples_per_second = secs > 0 ? static_cast<double>(r.history.samples) / secs : 0;
  if (sequences) r.tokens_per_second = r.samples_per_second * static_cast<double>(data.train.x.dim(1));
  r.recovery = guard.events();
  for (auto& l : model.layers()) {
    r.layer_compute_dtypes.emplace_back(l->name(), dtype_name(l->compute_dtype()));
    r.layer_policies.emplace_back(l->name(), l->dtype_policy().name());
  }
  // Recovery may have switched loss scaling on during training.
  const std::optional<LossScaleReport> scaler = model.optimizer().loss_scale_report();
  if (scaler && !r.loss_scaled) {
    r.loss_scaled = true;
    r.initial_scale = LossScaleOptions{}.initial_scale;
  }
  if (scaler) {
    r.final_scale = scaler->scale;
    r.min_scale_seen = scaler->min_scale_seen;
    r.skipped_steps = scaler->skipped_steps;
  }
}

}  // namespace

void adopt_resumed_eval_interval(RunConfig& cfg, std::ostream* progress) {
  if (cfg.resume_path.empty() || cfg.steps <= 0) return;
  const std::map<std::string, std::string> meta = load_safetensors_metadata(cfg.resume_path);
  const auto config = meta.find("config");
  if (config == meta.end()) return;
  const RunConfig saved = run_config_from_json(config->second, cfg.resume_path);
  // The checkpoint's epoch counts intervals of the saved length: read with another, 10 intervals of 2 steps
  // would be taken for 10 of 4, and a run raised from 20 to 40 steps would have nothing left to train.
  const int64_t interval = saved.steps_per_epoch();
  if (saved.steps <= 0 || interval == cfg.steps_per_epoch()) return;
  MIXTRAIN_CHECK(cfg.eval_interval == 0,
                 "--eval-every " << cfg.eval_interval << " differs from the evaluation interval of the run that saved "
                                 << cfg.resume_path << " (" << interval << " steps), which a resumed run keeps; "
                                 << "leave --eval-every out or give --eval-every " << interval);
  cfg.eval_interval = interval;
  if (progress)
    *progress << "evaluating every " << interval << " steps, as the run that saved " << cfg.resume_path << " did\n";
}

RunResult run_training(const RunConfig& given, const DataSplits& data, std::ostream* progress, bool interactive) {
  RunConfig cfg = given;
  adopt_resumed_eval_interval(cfg, progress);
  const int64_t live_before_model = memory_stats(cfg.device).live_bytes;
  std::unique_ptr<Model> model = compiled_run_model(cfg, data);
  int64_t model_bytes = memory_stats(cfg.device).live_bytes - live_before_model;
  const bool sequences = is_sequence_data(data);
  RunResult r;
  r.compute_dtype = dtype_name(DTypePolicy::from_name(cfg.policy).compute_dtype());
  if (const std::optional<LossScaleReport> scaler = model->optimizer().loss_scale_report()) {
    r.loss_scaled = true;
    r.initial_scale = scaler->scale;
  }
  if (progress) model->summary(*progress);
  ProgressBarLogger bar(progress ? *progress : std::cout, interactive);
  TerminateOnNaN nan_guard;
  FitOptions fo;
  fo.epochs = cfg.fit_epochs();
  fo.steps_per_epoch = cfg.steps_per_epoch();
  fo.batch_size = cfg.batch_size;
  fo.communicator = cfg.communicator;
  fo.zero_stage = cfg.zero_stage;
  fo.grad_comm = cfg.grad_comm == "bfloat16" ? DType::kBFloat16 : DType::kFloat32;
  fo.stop_request = cfg.stop_request;
  fo.verbose = 0;  // progress goes to `progress` alone, through the bar above; without it the run is silent
  const bool writes_checkpoints = cfg.communicator == nullptr || cfg.communicator->rank() == 0;
  // Token windows (a language model): the data set's second part is the validation text, evaluated at the end
  // of each epoch (each evaluation interval of a run by steps).
  // The recovery ladder handles non-finite steps itself; without it a NaN loss ends training (Keras' TerminateOnNaN).
  if (!cfg.recover) fo.callbacks.push_back(&nan_guard);
  if (progress) fo.callbacks.push_back(&bar);
  // Split off the validation rows (the last ones, as Keras) before measuring, so the peak counts what
  // training holds (batches, activations, gradients, optimizer state), not copies of the data set.
  ValidationSplit split = sequences ? ValidationSplit{data.train.x, data.train.y, data.test.x, data.test.y}
                                    : split_validation(data.train.x, data.train.y, cfg.validation_split);
  if (split.val_x.defined()) fo.validation_data = std::make_pair(split.val_x, split.val_y);
  if (!cfg.resume_path.empty()) {
    const int64_t live_before_resume = memory_stats(cfg.device).live_bytes;
    resume_run(cfg, *model, fo, r, progress);
    model_bytes += memory_stats(cfg.device).live_bytes - live_before_resume;  // the optimizer state it loaded
  }
  std::unique_ptr<CheckpointCallback> saver;
  // ZeRO-1: every rank saves along (gathering the sharded optimizer state), rank 0 alone writes.
  const bool sharded = cfg.zero_stage == 1 && cfg.communicator != nullptr && cfg.communicator->size() > 1;
  if (!cfg.save_path.empty() && (writes_checkpoints || sharded)) {
    saver = std::make_unique<CheckpointCallback>(cfg.save_path, 1, run_config_json(cfg), cfg.save_every);
    saver->set_writes(writes_checkpoints);
    fo.callbacks.push_back(saver.get());
  }
  // Scaled to the run, so a short run that fails or drifts gets the ladder too (said in the log and the report).
  RecoveryOptions ro = recovery_options_for_run(run_total_steps(cfg, data));
  ro.log = progress;
  if (cfg.recover) {
    r.recovery_timing = recovery_timing_text(ro);
    if (progress) *progress << "recovery: " << r.recovery_timing << "\n";
  }
  ro.reference_step_loss = cfg.reference_step_loss;
  RecoveryGuard guard(ro);
  if (cfg.recover) fo.recovery = &guard;

  // The device's memory: host memory on the CPU, the GPU's own on a GPU (the batches' host copies are not counted).
  const int64_t live_before = memory_stats(cfg.device).live_bytes;
  r.model_bytes = model_bytes;
  reset_peak_memory(cfg.device);
  r.history = model->fit(split.x, split.y, fo);
  r.peak_memory_bytes = memory_stats(cfg.device).peak_bytes - live_before;
  if (saver) r.checkpoint = saver->last_saved_path();
  // Stopped to be resumed: what is left (the test evaluation) would only delay the exit.
  r.interrupted = r.history.interrupted;
  if (r.interrupted) return r;
  finish_result(cfg, data, *model, fo, guard, r);
  return r;
}

std::string run_config_json(const RunConfig& cfg) {
  Json j = Json::object();
  j["model"] = cfg.model;
  Json hidden = Json::array();
  for (int64_t h : cfg.hidden) hidden.push_back(h);
  j["hidden"] = hidden;
  j["policy"] = cfg.policy;
  // Only under a float8 policy, so that the configuration of other runs reads as before.
  if (DTypePolicy::from_name(cfg.policy).uses_float8()) j["fp8_recipe"] = cfg.fp8_recipe;
  j["epochs"] = cfg.epochs;
  j["batch_size"] = cfg.batch_size;
  j["learning_rate"] = cfg.learning_rate;
  j["optimizer"] = cfg.optimizer;
  j["seed"] = static_cast<double>(cfg.seed);
  j["validation_split"] = cfg.validation_split;
  j["loss_scale"] = cfg.loss_scale;
  j["recover"] = cfg.recover;
  j["steps"] = cfg.steps;
  j["eval_interval"] = cfg.eval_interval;
  j["lr_schedule"] = cfg.lr_schedule;
  j["warmup_steps"] = cfg.warmup_steps;
  j["weight_decay"] = cfg.weight_decay;
  j["clipnorm"] = cfg.clipnorm;
  // Written only when accumulating, so that the configuration of other runs reads as before.
  if (cfg.gradient_accumulation_steps != 1) j["gradient_accumulation_steps"] = cfg.gradient_accumulation_steps;
  if (cfg.master_rounding != "nearest") j["master_rounding"] = cfg.master_rounding;
  if (cfg.optimizer_state != "float32") j["optimizer_state"] = cfg.optimizer_state;
  j["context_length"] = cfg.context_length;
  j["width"] = cfg.width;
  j["num_layers"] = cfg.num_layers;
  j["num_heads"] = cfg.num_heads;
  j["dropout"] = cfg.dropout;
  j["attention_logit_multiplier"] = cfg.attention_logit_multiplier;
  if (cfg.norm != "layer") j["norm"] = cfg.norm;
  if (cfg.mlp != "gelu") j["mlp"] = cfg.mlp;
  if (cfg.positions != "learned") j["positions"] = cfg.positions;
  if (cfg.model == "transformer") j["fused_loss"] = cfg.fused_loss;
  if (cfg.remat != "none") j["remat"] = cfg.remat;
  if (cfg.mlp_outliers_from >= 0) j["mlp_outliers_from"] = cfg.mlp_outliers_from;
  if (cfg.mlp_outliers_from >= 0) j["mlp_outliers_log2"] = cfg.mlp_outliers_log2;
  if (cfg.mlp_outliers_rise > 0) j["mlp_outliers_rise"] = cfg.mlp_outliers_rise;
  if (!cfg.vocabulary.empty()) {
    Json vocab = Json::array();
    for (uint32_t c : cfg.vocabulary) vocab.push_back(static_cast<double>(c));
    j["vocabulary"] = vocab;
  }
  // Only under a subword tokenizer, so that a character model's configuration reads as before.
  if (!cfg.tokenizer_model.empty()) {
    j["tokenizer"] = cfg.tokenizer;
    j["tokenizer_model"] = base64_encode(cfg.tokenizer_model);
  }
  return j.dump();
}

namespace {
// A text model's code points as a checkpoint's configuration lists them; none when absent.
std::vector<uint32_t> vocabulary_from_json(const Json* v, const std::string& source) {
  std::vector<uint32_t> out;
  if (!v) return out;
  MIXTRAIN_CHECK(v->is_array(), source << ": 'vocabulary' must be an array of code points");
  for (const Json& c : v->as_array()) {
    const int64_t cp = c.as_int64();
    MIXTRAIN_CHECK(cp >= 0 && cp <= 0x10FFFF, source << ": vocabulary entry " << cp << " is not a code point");
    out.push_back(static_cast<uint32_t>(cp));
  }
  return out;
}
}  // namespace

RunConfig run_config_from_json(const std::string& text, const std::string& source) {
  const Json j = Json::parse(text, source);
  MIXTRAIN_CHECK(j.is_object(), source << ": the run configuration must be a JSON object");
  RunConfig cfg;
  auto field = [&](const char* key) -> const Json* {
    const Json* v = j.find(key);
    return v && !v->is_null() ? v : nullptr;
  };
  auto str = [&](const char* key, std::string& out) {
    if (const Json* v = field(key)) {
      MIXTRAIN_CHECK(v->is_string(), source << ": '" << key << "' must be a string");
      out = v->as_string();
    }
  };
  auto num = [&](const char* key, auto& out) {
    if (const Json* v = field(key)) {
      MIXTRAIN_CHECK(v->is_number(), source << ": '" << key << "' must be a number");
      using T = std::remove_reference_t<decltype(out)>;
      if constexpr (std::is_integral_v<T>) out = static_cast<T>(v->as_int64());
      else out = static_cast<T>(v->as_number());
    }
  };
  str("model", cfg.model);
  if (const Json* h = field("hidden")) {
    MIXTRAIN_CHECK(h->is_array(), source << ": 'hidden' must be an array");
    cfg.hidden.clear();
    for (const Json& v : h->as_array()) cfg.hidden.push_back(v.as_int64());
  }
  str("policy", cfg.policy);
  str("fp8_recipe", cfg.fp8_recipe);
  num("epochs", cfg.epochs);
  num("batch_size", cfg.batch_size);
  num("learning_rate", cfg.learning_rate);
  str("optimizer", cfg.optimizer);
  num("seed", cfg.seed);
  num("validation_split", cfg.validation_split);
  str("loss_scale", cfg.loss_scale);
  if (const Json* v = field("recover")) cfg.recover = v->as_bool();
  num("steps", cfg.steps);
  num("eval_interval", cfg.eval_interval);
  str("lr_schedule", cfg.lr_schedule);
  num("warmup_steps", cfg.warmup_steps);
  num("weight_decay", cfg.weight_decay);
  num("clipnorm", cfg.clipnorm);
  num("gradient_accumulation_steps", cfg.gradient_accumulation_steps);
  str("master_rounding", cfg.master_rounding);
  str("optimizer_state", cfg.optimizer_state);
  num("context_length", cfg.context_length);
  num("width", cfg.width);
  num("num_layers", cfg.num_layers);
  num("num_heads", cfg.num_heads);
  num("dropout", cfg.dropout);
  num("attention_logit_multiplier", cfg.attention_logit_multiplier);
  str("norm", cfg.norm);
  str("mlp", cfg.mlp);
  str("positions", cfg.positions);
  // A checkpoint from before the fused loss trained with the layers then the loss.
  const Json* fused = field("fused_loss");
  MIXTRAIN_CHECK(!fused || fused->is_bool(), source << ": 'fused_loss' must be true or false");
  cfg.fused_loss = fused && fused->as_bool();
  str("remat", cfg.remat);  // absent (a checkpoint from before the option): none
  num("mlp_outliers_from", cfg.mlp_outliers_from);  // absent: off
  num("mlp_outliers_log2", cfg.mlp_outliers_log2);  // absent (saved before the power could be chosen): 14
  num("mlp_outliers_rise", cfg.mlp_outliers_rise);  // absent: 0, a jump
  cfg.vocabulary = vocabulary_from_json(field("vocabulary"), source);
  str("tokenizer", cfg.tokenizer);
  std::string tokenizer_model;
  str("tokenizer_model", tokenizer_model);
  cfg.tokenizer_model = base64_decode(tokenizer_model, source + " 'tokenizer_model'");
  try {
    validate_run_config(cfg);
  } catch (const Error& e) {  // its messages name train's flags, which the reader of a file never passed
    MIXTRAIN_FAIL(kInvalidInput, source << ": the saved run configuration is not valid: " << e.message(),
                  "the file was damaged or edited (its settings are named as train's flags)");
  }
  return cfg;
}

}  // namespace mixtrain
