// RecoveryGuard: the recovery ladder for mixed precision, applied by Model::fit one rung at a time.
//   1. A non-finite loss or gradient: make sure dynamic loss scaling is on, roll back to the last good
//      in-memory snapshot (weights, optimizer and loss-scale state, random streams, data position), continue.
//   2. Still failing (max_consecutive_failures bad steps in a row, the loss scale stuck at its floor, or the
//      smoothed loss drifting above a float32 reference run's for as many steps):
//      inspect the failing batch (the statistics of `mixtrain inspect`), switch only the layers whose
//      inputs or outputs overflow or turn NaN in their compute dtype to float32, roll back, continue.
//      Repeated while it finds new layers to switch.
//   3. Still failing, or no layer to blame: switch the whole model to float32, roll back, continue.
//   In float32 and still failing: stop training (nothing more to try) and say so.
// Every action is printed and recorded. A rollback restores the snapshot bit for bit.
#pragma once

#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "mixtrain/core/random.h"
#include "mixtrain/optim/optimizer.h"
#include "mixtrain/train/history.h"

namespace mixtrain {

class Model;

struct RecoveryEvent {
  int64_t step = 0;                 // global training step (1-based) at which the action was taken
  std::string action;               // "enable_loss_scaling", "rollback", "layers_to_float32", "model_to_float32", "give_up"
  std::string reason;
  std::vector<std::string> layers;  // layers switched, for layers_to_float32 / model_to_float32
};

struct RecoveryOptions {
  int64_t snapshot_every = 50;            // steps between snapshots while training is healthy
  int64_t max_consecutive_failures = 20;  // skipped or non-finite steps in a row before climbing a rung
  std::ostream* log = nullptr;            // where actions are printed (nullptr: std::cerr)
  // Per-step training loss of a float32 run on the same data order and seed (e.g. compare's baseline);
  // empty: no drift check. Both curves are smoothed (exponential moving average over ~50 steps); after
  // drift_warmup_steps, the run drifts while its smoothed loss exceeds the reference's by drift_tolerance.
  std::vector<double> reference_step_loss;
  double drift_tolerance = 0.25;
  int64_t drift_warmup_steps = 100;
};

// Where fit() was when a snapshot was taken: enough to replay the same batches in the same order.
struct FitPosition {
  int epoch = 0;
  int64_t step = 0;                 // step within the epoch
  std::vector<int64_t> order;       // the epoch's row order
  Logs sums;                        // the epoch's running sums
  int64_t seen = 0;
  size_t history_steps = 0;         // History::step_loss size
  size_t history_scales = 0;        // History::step_loss_scale size
  int64_t history_samples = 0;
};

class RecoveryGuard {
 public:
  explicit RecoveryGuard(RecoveryOptions options = {});

  // Called by fit(): keeps an in-memory snapshot of the model's training state at `position`.
  void snapshot(Model& model, const FitPosition& position);
  bool has_snapshot() const { return has_snapshot_; }
  int64_t snapshot_every() const { return options_.snapshot_every; }
  // True while no bad step happened since the last snapshot (a snapshot is only taken of a good state).
  bool healthy() const { return consecutive_failures_ == 0 && drifting_steps_ == 0; }
  // Called by fit() after each step with that step's logs and batch; returns true when fit() must roll
  // back (call restore()). global_step is the 1-based position of the step in the training run (it
  // indexes the reference loss; after a rollback it repeats the replayed positions).
  // batch() gives the step's rows in float32 (only called when a rung needs to inspect them).
  bool after_step(Model& model, const Logs& step_logs, const std::function<std::pair<Tensor, Tensor>()>& batch,
                  int64_t global_step);
  // Restores the snapshot into the model and returns where fit() resumes.
  const FitPosition& restore(Model& model);
  // True after the last rung failed: fit() stops.
  bool gave_up() const { return gave_up_; }

  const std::vector<RecoveryEvent>& events() const { return events_; }

 private:
  void record(RecoveryEvent event);
  // Updates the smoothed losses; true while this run drifts above the reference.
  bool drifts(double loss, int64_t global_step);
  // Rungs 2 and 3 (switch the layers to blame, else the whole model, to float32; or give up).
  bool climb(Model& model, const std::function<std::pair<Tensor, Tensor>()>& batch, int64_t global_step,
             const std::string& why);

  RecoveryOptions options_;
  bool has_snapshot_ = false;
  FitPosition position_;
  std::vector<Tensor> weights_;
  NamedTensors optimizer_state_;
  bool optimizer_was_scaled_ = false;
  std::vector<uint64_t> shuffle_state_, dropout_state_;
  int64_t consecutive_failures_ = 0;
  int64_t drifting_steps_ = 0;
  double ema_ = 0, reference_ema_ = 0;  // smoothed loss of this run and of the reference
  double snapshot_ema_ = 0, snapshot_reference_ema_ = 0;
  int rung_ = 0;
  bool gave_up_ = false;
  std::vector<RecoveryEvent> events_;
};

}  // namespace mixtrain
