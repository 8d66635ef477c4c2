// Training checkpoints: one safetensors file that resumes a fit() bit-identically.
//
// Contents (standard dtypes only, so any safetensors reader opens it):
//   "<variable name>"       every model weight in its variable dtype, e.g. "dense/kernel" F32 (in, units)
//   "optimizer/<key>"       Optimizer::state(), e.g. "optimizer/iterations", "optimizer/dense/kernel/m",
//                           and for a LossScaleOptimizer "optimizer/loss_scale/scale", ...
//   "layer_state/<layer name>/<entry>"
//                           Layer::extra_state(): under a float8 policy with the delayed recipe, each FP8 layer's
//                           "fp8/<input|weight|grad>/amax_history" F32 (1024,) and ".../scale" F32 (1,), so a
//                           resume scales as the uninterrupted run would; files without them load as before
//   "rng/init", "rng/shuffle", "rng/dropout"
//                           the Model's Rng states: U8 (4, 8), one row per uint64 word, little-endian bytes
// __metadata__: "format" = "mixtrain-checkpoint-1" ("-2" for a file saved inside an epoch, see below), "epoch"
//   (completed epochs), "seed", "config" (free-form), "optimizer" (the inner name under a loss-scale wrapper),
//   "loss_scale_optimizer" ("true"/"false"), "layers" (layer names in order, comma-separated),
//   "layer/<name>/policy", "input_shape" (JSON array).
//   Saved while fit() runs (from a callback) also: "step" (steps done in the epoch in progress) and "fit_state",
//   a JSON object of the FitState (train/fit_state.h): data-stream shape, the epoch's shuffle state (4 words as
//   16 hex digits each), running sums, rows seen and the History so far; numbers are written so they read back
//   to the same double ("nan", "inf", "-inf" as strings). A file with step > 0 is format 2, so an older mixtrain
//   refuses it by name instead of resuming it as an epoch boundary; older files (format 1, no fit_state) load as
//   epoch-boundary checkpoints.
//
// Resuming: build and compile the model exactly as before (same layers, policy, optimizer), call
// load_checkpoint(), then fit(..., {.epochs = N, .resume = info.fit_state}) when the file holds a fit state (the
// next batch, the whole History), else fit(..., {.epochs = N, .initial_epoch = info.epoch}). Weights are matched
// by variable path ("<layer name>/<weight name>"); layer names are unique per model ("dense", "dense_1", ... in
// model order, or given with name=), so a model built the same way loads a checkpoint in any process, after any
// other model.
// To load weights only, into a model built differently, see save_weights / load_weights (train/weights_file.h).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "mixtrain/train/callbacks.h"
#include "mixtrain/train/fit_state.h"

namespace mixtrain {

class Model;

// The value of the "format" metadata entry of checkpoints this version writes and reads: at an epoch boundary
// (or outside fit()), and inside an epoch (which an older version must not take for an epoch boundary).
inline constexpr const char* kCheckpointFormat = "mixtrain-checkpoint-1";
inline constexpr const char* kCheckpointFormatMidEpoch = "mixtrain-checkpoint-2";
// Whether a "format" value is one of the two above.
bool is_checkpoint_format(const std::string& format);

struct CheckpointInfo {
  // Completed epochs when saved; resume with FitOptions::initial_epoch = epoch (or with fit_state, below).
  // Saved during fit() (model.fit_state() set), the epoch comes from the fit's position and this one is ignored.
  int epoch = 0;
  // Free-form text stored with the checkpoint (e.g. the RunConfig as JSON).
  std::string config;
  // More __metadata__ entries for save_checkpoint to write (save_model's architecture); a key the checkpoint writes
  // itself is refused. load_checkpoint returns them in `metadata`.
  std::map<std::string, std::string> extra_metadata;
  // Filled by load_checkpoint; save_checkpoint takes these from the model and ignores the fields here.
  uint64_t seed = 0;
  std::string optimizer;              // "adam", ...: the inner optimizer's name; empty when none was saved
  bool loss_scale_optimizer = false;  // the optimizer was wrapped in a LossScaleOptimizer
  std::map<std::string, std::string> metadata;  // the whole __metadata__ table (without checksum entries)
  bool checksums_verified = false;              // every tensor and the metadata matched their checksums
  // Filled by load_checkpoint for a file saved while fit() ran: pass it as FitOptions::resume to continue at the
  // exact next batch. Empty for files saved outside fit() or by older versions.
  std::optional<FitState> fit_state;
};

// Writes model weights, optimizer state (when compiled), Rng states, metadata, the fit's position and History when
// called while fit() runs (Model::fit_state()), and checksums of all of them to path
// atomically (an existing file is replaced only by a complete new one; temp files of killed saves are removed,
// see save_safetensors). The model must be built. Throws Error (kInvalidInput) without
// writing when a weight or a floating optimizer entry holds NaN or Inf, so a diverged run never overwrites a good
// checkpoint; kIo when the file cannot be written.
void save_checkpoint(const std::string& path, Model& model, const CheckpointInfo& info);

// Validates the whole file against the model, then restores weights, optimizer state and Rng states. Refuses,
// with Error (kInvalidInput) naming the file and the mismatch and leaving the model untouched: a tensor or
// metadata entry that fails its checksum (see io/safetensors.h), a truncated file or one whose header claims
// bytes past its end, NaN or Inf in any tensor (save_checkpoint never writes them), a wrong or missing format tag,
// other layer names or policies, a missing, extra or differently shaped / typed weight, a different optimizer (or
// loss-scale wrapping), optimizer slots that do not fit the model's variables, bad Rng entries. An unbuilt model
// is first built for the saved input shape (it stays built if a later check fails). An uncompiled model, or a
// checkpoint saved without an optimizer, restores weights and Rng states only and leaves any optimizer as it is:
// compile before loading to resume training. A file without checksums (saved before they were added) is loaded
// after the same checks, with a warning on stderr and CheckpointInfo::checksums_verified false. Returns the
// stored info.
CheckpointInfo load_checkpoint(const std::string& path, Model& model);

// Whether every weight and every floating optimizer state entry of model is finite (what save_checkpoint requires).
bool checkpoint_state_is_finite(const Model& model);

// Saves a checkpoint at the end of every `period`-th epoch (epochs period, 2*period, ... counting from 1) with
// CheckpointInfo::epoch = completed epochs. "{epoch}" in path is replaced by that number (as Keras'
// ModelCheckpoint), e.g. "ckpt-{epoch}.safetensors"; without it each save replaces the previous file. When the
// weights or optimizer state hold NaN/Inf the save is skipped with a warning on stderr and the previous file
// stays as it was: no NaN reaches a saved checkpoint.
// With every_steps > 0 it also saves after every every_steps-th step of the data stream (global steps
// every_steps, 2*every_steps, ... counted from the run's start across epochs and resumes; a step whose update the
// loss scale skipped counts, as its batch was drawn), so a run killed at any moment resumes at most every_steps
// batches back, bit-identically. Such a save inside epoch e (0-based) names the file with {epoch} = e + 1 (as
// Keras), the name the end of that epoch then replaces.
// keras.callbacks.ModelCheckpoint's monitor, save_best_only and mode.
struct CheckpointMonitor {
  std::string monitor = "val_loss";
  // Epoch-end saves happen only when the monitored value beats the best so far (strictly; NaN never does), so the
  // file holds the best epoch's state. Step saves (every_steps) are for resuming and are not affected.
  bool save_best_only = false;
  std::string mode = "auto";  // "min", "max", or "auto": "max" when the monitor's name contains "acc", as Keras

  // Chained setters, in any order.
  CheckpointMonitor& with_monitor(std::string v) { monitor = std::move(v); return *this; }
  CheckpointMonitor& with_save_best_only(bool v) { save_best_only = v; return *this; }
  CheckpointMonitor& with_mode(std::string v) { mode = std::move(v); return *this; }
};

// Every optional argument of CheckpointCallback: ModelCheckpoint's monitor, save_best_only and mode (as
// CheckpointMonitor), then the period, the step interval and the run configuration stored in each file.
struct CheckpointOptions {
  std::string monitor = "val_loss";
  bool save_best_only = false;
  std::string mode = "auto";
  int period = 1;            // save at the end of every period-th epoch
  int64_t every_steps = 0;   // also after every every_steps-th step (0: epoch ends only)
  std::string config = "";   // stored as CheckpointInfo::config

  // Chained setters, in any order: `CheckpointOptions().with_save_best_only(true).with_monitor("val_accuracy")`.
  CheckpointOptions& with_monitor(std::string v) { monitor = std::move(v); return *this; }
  CheckpointOptions& with_save_best_only(bool v) { save_best_only = v; return *this; }
  CheckpointOptions& with_mode(std::string v) { mode = std::move(v); return *this; }
  CheckpointOptions& with_period(int v) { period = v; return *this; }
  CheckpointOptions& with_every_steps(int64_t v) { every_steps = v; return *this; }
  CheckpointOptions& with_config(std::string v) { config = std::move(v); return *this; }
};

class CheckpointCallback : public Callback {
 public:
  explicit CheckpointCallback(std::string path, int period = 1, std::string config = "", int64_t every_steps = 0);
  // The same with every option by name, Keras' ModelCheckpoint(path, monitor=, save_best_only=, ...):
  // `CheckpointCallback("best.safetensors", {.monitor = "val_accuracy", .save_best_only = true})`.
  CheckpointCallback(std::string path, const CheckpointOptions& options);
  const CheckpointMonitor& monitor() const { return monitor_; }
  // Keras' ModelCheckpoint(monitor=, save_best_only=, mode=); an unknown mode is an error. A monitor missing from
  // an epoch's logs is an error when save_best_only is set. The best value starts afresh at every fit().
  void set_monitor(CheckpointMonitor monitor);
  double best() const { return best_; }
  void on_train_begin(int epochs, int64_t steps_per_epoch) override;
  void on_epoch_begin(int epoch) override;
  void on_train_batch_end(int64_t step, const Logs& logs) override;
  void on_epoch_end(int epoch, const Logs& logs) override;
  // Saves the position of an interrupted fit (a StopRequest), path_for(epoch + 1) as a step save, with or
  // without every_steps: the file a resumed fit continues from at the next batch.
  void on_train_interrupted(int epoch, int64_t steps_done) override;

  // The path written for a given number of completed epochs.
  std::string path_for(int completed_epochs) const;
  int saves() const { return saves_; }
  int skipped_saves() const { return skipped_saves_; }
  // The last file written; empty before the first save.
  const std::string& last_saved_path() const { return last_saved_path_; }
  // Data parallel with a sharded optimizer (ZeRO-1): every rank runs a callback, so that all of them gather the
  // optimizer state at each save (Optimizer::gather_shards), and only the one that writes (rank 0) is given true.
  void set_writes(bool writes) { writes_ = writes; }

 private:
  // Writes path unless the state holds NaN/Inf (then warns, naming what saved it and returns false).
  bool save(const std::string& path, int completed_epochs, const std::string& when);

  std::string path_;
  int period_;
  bool writes_ = true;
  std::string config_;
  int64_t every_steps_;
  int64_t steps_per_epoch_ = 0;
  int epoch_ = 0;  // the epoch in progress
  int64_t saved_step_ = -1;  // the step of the data stream the last step save wrote
  int saves_ = 0;
  int skipped_saves_ = 0;
  std::string last_saved_path_;
  CheckpointMonitor monitor_;
  bool maximize_ = false;
  double best_ = 0;
  // Whether an epoch's logs beat the best (and then record it as the best).
  bool improves(const Logs& logs);
};

}  // namespace mixtrain
