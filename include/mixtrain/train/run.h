// A complete training run as the CLI performs it: build the named model under a policy, fit it on a
// data set with a seed, evaluate on the test split, and measure speed and memory. `train` runs one;
// a comparison runs several on identical data, initial weights and dropout masks.
#pragma once

#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/data/dataset.h"
#include "mixtrain/distributed/communicator.h"
#include "mixtrain/train/model.h"
#include "mixtrain/train/run_config.h"

namespace mixtrain {

struct RunResult {
  History history;
  EvaluateResult test;
  double steps_per_second = 0;
  double samples_per_second = 0;
  double tokens_per_second = 0;   // sequence models: samples/s times the sequence length (0 otherwise)
  int64_t peak_memory_bytes = 0;  // allocator peak during fit(), above what was live before it
  // What the built and compiled model held when fit() started (its weights, and any state a resume loaded): with
  // peak_memory_bytes, the run's whole peak, which a MemoryPlan's total_bytes() plans.
  int64_t model_bytes = 0;
  std::string compute_dtype;
  // Loss-scale summary (float16 compute with dynamic or fixed scaling).
  bool loss_scaled = false;
  double initial_scale = 0, final_scale = 0, min_scale_seen = 0;
  int64_t skipped_steps = 0;
  std::vector<RecoveryEvent> recovery;   // actions of the recovery ladder, in order
  std::string recovery_timing;           // with cfg.recover: when its checks act (recovery_timing_text)
  std::vector<std::pair<std::string, std::string>> layer_compute_dtypes;  // after training (recovery may change them)
  // The layers' dtype policies after training: what tells a float8 layer (computing in bfloat16 around its FP8
  // GEMM) from one the recovery ladder's FP8 rung moved to mixed_bfloat16.
  std::vector<std::pair<std::string, std::string>> layer_policies;
  int initial_epoch = 0;                 // > 0 when resumed from a checkpoint
  // Stopped by cfg.stop_request before the last step: no test evaluation or speed was measured.
  bool interrupted = false;
  // The last checkpoint written (the position an interrupted run resumes from); empty when none was.
  std::string checkpoint;
};

// Validates cfg (names, positive epochs / batch size / learning rate); throws Error naming the field.
void validate_run_config(const RunConfig& cfg);
// Builds (not yet trained) the model cfg names, under cfg.policy, for num_features inputs (one sample shaped
// sample_shape when known, e.g. {28, 28}) and num_classes outputs.
// Refuses (Error, kInvalidInput) a model that cannot fit under the memory limit (set_memory_limit), before it is
// built: the registry's size estimate of cfg.model (a lower bound: weights with their gradients and optimizer
// slots, plus batch samples of activations; batch 0 counts the weights only). Says what would fit.
struct ModelInputSpec;
void check_model_fits_memory(const RunConfig& cfg, const ModelInputSpec& input, int64_t batch);
std::unique_ptr<Model> build_model(const RunConfig& cfg, int64_t num_features, int64_t num_classes,
                                   const std::vector<int64_t>& sample_shape = {});
// The optimizer a run uses: cfg.optimizer at cfg.learning_rate, with cfg's weight decay (AdamW, biases and
// normalization parameters excluded), gradient clipping and learning-rate schedule.
// total_steps: the updates of the whole run, over which the schedule runs.
std::unique_ptr<Optimizer> make_run_optimizer(const RunConfig& cfg, int64_t total_steps);
// cfg.warmup_steps with kAutoWarmup resolved for a run of total_steps updates.
int64_t resolved_warmup_steps(const RunConfig& cfg, int64_t total_steps);
// A run by steps resumed (cfg.resume_path) with another --steps keeps the evaluation interval of the run that saved
// the checkpoint, since its position counts those intervals: cfg.eval_interval is set to it when it was left to be
// derived from cfg.steps (0), and a different explicit one is refused. Says so on `progress`. Reads the file's
// header only; nothing changes for a run by epochs, a fresh run or the same steps.
void adopt_resumed_eval_interval(RunConfig& cfg, std::ostream* progress);
// Builds, compiles, fits and evaluates. progress: where the progress bar goes (nullptr: silent).
// Calls adopt_resumed_eval_interval on a copy of cfg first.
RunResult run_training(const RunConfig& cfg, const DataSplits& data, std::ostream* progress, bool interactive);
// cfg as a JSON string (stored in checkpoints), and back: run_config_from_json(run_config_json(c)) gives c's
// fields (except paths and reference losses). Error naming `source` on malformed JSON or a field of the wrong type;
// fields missing from older checkpoints keep their defaults.
std::string run_config_json(const RunConfig& cfg);
RunConfig run_config_from_json(const std::string& json, const std::string& source);

}  // namespace mixtrain
