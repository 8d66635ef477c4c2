// A complete training run as the CLI performs it: build the named model under a policy, fit it on a
// data set with a seed, evaluate on the test split, and measure speed and memory. `train` runs one;
// a comparison runs several on identical data, initial weights and dropout masks.
#pragma once

#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/data/dataset.h"
#include "mixtrain/train/model.h"

namespace mixtrain {

struct RunConfig {
  std::string model = "mlp";             // a registered model (train/model_registry.h): mlp, cnn, resnet
  std::vector<int64_t> hidden = {256, 128};
  std::string policy = "float32";        // a DTypePolicy name
  int epochs = 5;
  // 128 rather than Keras' 32: at 5 epochs the final test accuracy of batch-32 Adam swings by about
  // half a point with the last few updates, which hides the float32 / mixed comparison in noise.
  int64_t batch_size = 128;
  float learning_rate = 1e-3f;
  std::string optimizer = "adam";        // "adam", "adamw", "sgd"
  uint64_t seed = 1;
  double validation_split = 0.1;         // last fraction of the training rows, as Keras
  std::string loss_scale = "dynamic";    // float16 compute only: "dynamic", "none", or a fixed value
  bool recover = false;                  // run the recovery ladder (train/recovery.h)
  std::string save_path;                 // checkpoint written after every epoch (empty: none)
  std::string resume_path;               // checkpoint to resume from (empty: start fresh)
  // With recover: a float32 run's per-step loss on the same data order, for the recovery drift check.
  std::vector<double> reference_step_loss;
};

struct RunResult {
  History history;
  EvaluateResult test;
  double steps_per_second = 0;
  double samples_per_second = 0;
  int64_t peak_memory_bytes = 0;  // allocator peak during fit(), above what was live before it
  std::string compute_dtype;
  // Loss-scale summary (float16 compute with dynamic or fixed scaling).
  bool loss_scaled = false;
  double initial_scale = 0, final_scale = 0, min_scale_seen = 0;
  int64_t skipped_steps = 0;
  std::vector<RecoveryEvent> recovery;   // actions of the recovery ladder, in order
  std::vector<std::pair<std::string, std::string>> layer_compute_dtypes;  // after training (recovery may change them)
  int initial_epoch = 0;                 // > 0 when resumed from a checkpoint
};

// Validates cfg (names, positive epochs / batch size / learning rate); throws Error naming the field.
void validate_run_config(const RunConfig& cfg);
// Builds (not yet trained) the model cfg names, under cfg.policy, for num_features inputs (one sample shaped
// sample_shape when known, e.g. {28, 28}) and num_classes outputs.
std::unique_ptr<Model> build_model(const RunConfig& cfg, int64_t num_features, int64_t num_classes,
                                   const std::vector<int64_t>& sample_shape = {});
// Builds, compiles, fits and evaluates. progress: where the progress bar goes (nullptr: silent).
RunResult run_training(const RunConfig& cfg, const DataSplits& data, std::ostream* progress, bool interactive);
// cfg as a JSON string (stored in checkpoints).
std::string run_config_json(const RunConfig& cfg);

}  // namespace mixtrain
