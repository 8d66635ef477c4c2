// A complete training run as the CLI performs it: build the named model under a policy, fit it on a
// data set with a seed, evaluate on the test split, and measure speed and memory. `train` runs one;
// a comparison runs several on identical data, initial weights and dropout masks.
#pragma once

#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/data/dataset.h"
#include "mixtrain/dist/communicator.h"
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
  std::string optimizer = "adam";        // "adam", "adamw", "sgd", "rmsprop"
  uint64_t seed = 1;
  double validation_split = 0.1;         // last fraction of the training rows, as Keras
  std::string loss_scale = "dynamic";    // float16 compute only: "dynamic", "none", or a fixed value
  bool recover = false;                  // run the recovery ladder (train/recovery.h)
  std::string save_path;                 // checkpoint written after every epoch (empty: none)
  // > 0: save_path is also written after every save_every steps of the data stream (CheckpointCallback's
  // every_steps), so a killed run resumes bit-identically from at most that many batches back.
  int64_t save_every = 0;
  std::string resume_path;               // checkpoint to resume from (empty: start fresh)
  // With recover: a float32 run's per-step loss on the same data order, for the recovery drift check.
  std::vector<double> reference_step_loss;

  // ---- Training by steps (language models) ----
  // > 0: train this many steps on batches drawn at random from the training windows, instead of epochs,
  // evaluating the validation loss every eval_interval steps (0: steps / 10, at least 1).
  int64_t steps = 0;
  int64_t eval_interval = 0;
  // Learning-rate schedule over the whole run, after a linear warm-up over warmup_steps: "constant", "cosine"
  // (decay to 0.1 x the rate) or "linear" (decay to 0); see make_schedule() in optim/schedules.h.
  std::string lr_schedule = "constant";
  // kAutoWarmup: min(100, a tenth of the run's updates), resolved once the run's length is known.
  static constexpr int64_t kAutoWarmup = -1;
  int64_t warmup_steps = 0;
  float weight_decay = 0.004f;  // AdamW only; the Keras default
  float clipnorm = 0;           // > 0: clip gradients to this global norm after unscaling
  // ---- The transformer (--model transformer) ----
  int64_t context_length = 64;   // characters per window
  int64_t width = 128;           // model width (embedding size)
  int64_t num_layers = 2;
  int64_t num_heads = 4;
  float dropout = 0.0f;
  // Multiplies the attention logits: > 1 makes float16 logits overflow on purpose (to exercise recovery).
  float attention_logit_multiplier = 1.0f;
  // The character vocabulary (code points) of a text data set; stored in checkpoints for `generate`.
  std::vector<uint32_t> vocabulary;
  // Data-parallel training (not owned; null or one rank: one process). Every rank runs run_training with the same
  // configuration and data; batch_size is the global batch. Rank 0 alone writes the checkpoints; a checkpoint
  // resumes with any number of ranks. Not stored in checkpoints.
  Communicator* communicator = nullptr;
  // Data-parallel: every BatchNormalization layer normalizes with the global batch's statistics over the ranks
  // (BatchNormalization::set_synchronized, as PyTorch's SyncBatchNorm), so N ranks train as one process on the
  // global batch. Without it each rank uses its shard's statistics (PyTorch DDP's default). One process: no effect.
  bool synchronized_batch_norm = false;
  // Where the model trains (--device): its weights, batches, activations and optimizer state live there, and the
  // peak memory reported is that device's. Not stored in checkpoints: a checkpoint resumes on any device.
  Device device = Device::cpu();

  // Number of epochs fit() runs: epochs, or for a run by steps the number of evaluation intervals.
  int fit_epochs() const;
  // Steps per fit() epoch in a run by steps (0 otherwise).
  int64_t steps_per_epoch() const;
};

struct RunResult {
  History history;
  EvaluateResult test;
  double steps_per_second = 0;
  double samples_per_second = 0;
  double tokens_per_second = 0;   // sequence models: samples/s times the sequence length (0 otherwise)
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
// Builds, compiles, fits and evaluates. progress: where the progress bar goes (nullptr: silent).
RunResult run_training(const RunConfig& cfg, const DataSplits& data, std::ostream* progress, bool interactive);
// cfg as a JSON string (stored in checkpoints), and back: run_config_from_json(run_config_json(c)) gives c's
// fields (except paths and reference losses). Error naming `source` on malformed JSON or a field of the wrong type;
// fields missing from older checkpoints keep their defaults.
std::string run_config_json(const RunConfig& cfg);
RunConfig run_config_from_json(const std::string& json, const std::string& source);

}  // namespace mixtrain
