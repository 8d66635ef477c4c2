// RecoveryGuard: the recovery ladder for mixed precision, applied by Model::fit one rung at a time.
//   1. A non-finite loss or gradient: make sure dynamic loss scaling is on, roll back to the last good
//      in-memory snapshot (weights, optimizer and loss-scale state, random streams, data position), continue.
//   2. Still failing (max_consecutive_failures bad steps in a row, the loss scale stuck at its floor, or the
//      smoothed loss drifting above a float32 reference for as many steps): measure the failing batches
//      (the current one and the last one whose loss or gradients were non-finite) in a float32 shadow of
//      the model, as `mixtrain inspect` does, and switch to float32 only the layers to blame (see
//      layers_to_blame), roll back, continue. Repeated while it finds new layers to switch.
//      A layer under a float8 policy moves to mixed_bfloat16 instead (the FP8 rung: its GEMM runs on bfloat16
//      operands), and to float32 only when it is blamed again. Besides the checks above, such a layer is blamed
//      when its GEMM input, cast at the scale its recipe would use now, saturates or flushes to zero past
//      kFp8SaturatedShare or kFp8FlushedShare, or did so in a cast of training since the last climb (the layers
//      record the largest shares of their casts while the ladder guards them: Fp8CastRecord). The FP8 rung also
//      climbs on its own, before any loss drifts, when a layer's input saturates past kFp8SaturatedShare on
//      kFp8SaturatedSteps steps in a row: a scale that stays behind its tensor (docs/FP8.md, the hostile case).
//   3. Still failing, or no layer to blame: switch the whole model to float32, roll back, continue.
//   In float32 and still failing: stop training (nothing more to try) and say so.
// Every action is printed and recorded. A rollback restores the snapshot bit for bit, except that after rungs 2
// and 3 the loss scale starts over from its initial value: the overflows that drove it down came from layers
// now computing in float32, and a collapsed scale would leave the 16-bit layers' gradients underflowing.
#pragma once

#include <functional>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "mixtrain/core/random.h"
#include "mixtrain/nn/network.h"
#include "mixtrain/optim/optimizer.h"
#include "mixtrain/precision/fp8_gemm_scales.h"
#include "mixtrain/precision/fp8_scaling.h"
#include "mixtrain/precision/range_stats.h"
#include "mixtrain/train/fit_state.h"
#include "mixtrain/train/history.h"

namespace mixtrain {

// What the recovery ladder reads and changes in the model it guards. Model implements it (train/model.h), and fit()
// hands itself to the ladder through it.
class RecoveryTarget {
 public:
  // The layers and weights: the ones a snapshot keeps, a rung switches to float32 and a float32 shadow measures.
  virtual Network& network() = 0;
  virtual bool compiled() const = 0;
  virtual Optimizer& optimizer() = 0;
  // The shuffle and dropout streams, which a snapshot keeps so that a rollback replays the same batches and masks.
  virtual Rng& shuffle_rng() = 0;
  virtual Rng& dropout_rng() = 0;
  // Rung 1: wraps the optimizer in a dynamic LossScaleOptimizer unless it is one.
  virtual void enable_dynamic_loss_scaling() = 0;
  // The last rung failed: training ends after this step.
  virtual void request_stop() = 0;

 protected:
  ~RecoveryTarget() = default;
};

struct RecoveryEvent {
  int64_t step = 0;                 // global training step (1-based) at which the action was taken
  // "enable_loss_scaling", "rollback", "layers_to_bfloat16", "layers_to_float32", "model_to_float32", "give_up"
  std::string action;
  std::string reason;
  std::vector<std::string> layers;  // layers switched, for layers_to_bfloat16 / layers_to_float32 / model_to_float32
  // rollback: the number of steps kept in the history, i.e. training resumes with global step resume_step + 1
  // (the replayed steps take the positions of the ones rolled back). -1 for the other actions.
  int64_t resume_step = -1;
};

// The drift check's smoothing: an exponential moving average of weight kDriftSmoothing (about 50 steps of
// memory) that starts at the first value.
inline constexpr double kDriftSmoothing = 0.98;
std::vector<double> drift_smoothed(const std::vector<double>& loss);
// The reference_step_loss whose drift check fires exactly where a run's drift-smoothed loss exceeds
// `ceiling` (a curve on the drift_smoothed scale, e.g. the upper edge of float32's seed band plus its
// tolerance) under drift_tolerance: drift_smoothed(result) * (1 + drift_tolerance) == ceiling. The result
// ends before the first non-finite ceiling value (no drift check from there on).
std::vector<double> drift_reference_for_ceiling(const std::vector<double>& ceiling, double drift_tolerance);

struct RecoveryOptions {
  int64_t snapshot_every = 50;            // steps between snapshots while training is healthy
  int64_t max_consecutive_failures = 20;  // skipped or non-finite steps in a row before climbing a rung
  std::ostream* log = nullptr;            // where actions are printed (nullptr: std::cerr)
  // Per-step training loss of a float32 run on the same data order and seed, or (compare) a curve made by
  // drift_reference_for_ceiling from float32's seed band; empty: no drift check. Both curves are smoothed
  // (drift_smoothed); after drift_warmup_steps, the run drifts while its smoothed loss exceeds the
  // reference's by drift_tolerance.
  std::vector<double> reference_step_loss;
  double drift_tolerance = 0.25;
  int64_t drift_warmup_steps = 100;
};

// The options for a run of total_steps updates: the drift check's warm-up and the steps in a row that climb a
// rung (max_consecutive_failures, for non-finite and for drifting steps) scaled to the run, so a short run that
// fails or leaves its reference gets the ladder too: each a fifth of the run, at least 5 steps and at most the
// defaults (100 and 20), which every run of 500 steps or more keeps.
RecoveryOptions recovery_options_for_run(int64_t total_steps);
// One line saying when the checks of `options` act, for logs and reports: "the drift check starts after step
// 16; a rung is climbed after 16 failed or drifting steps in a row".
std::string recovery_timing_text(const RecoveryOptions& options);

// What the float32 shadow of a model (every layer computing in float32, same weights, inference mode) shows
// about one layer's values against the layer's real compute dtype, on one batch.
struct LayerNumerics {
  std::string layer;
  DType compute_dtype = DType::kFloat32;
  RangeStats inputs, outputs;
  RangeStats internal;          // values a layer reports from inside its call (attention logits), if any
  // Rounding to the compute dtype, per column (the last axis: features or channels; every other axis
  // counts as rows): a column loses its signal when the rounding error's RMS reaches kSignalLossNoiseRatio
  // times the column's standard deviation over the rows (flushing to zero and subnormal spacing included,
  // so this is where underflow shows). Columns with no spread are not counted.
  int64_t columns = 0;          // columns with spread, inputs and outputs together
  int64_t lost_columns = 0;     // of which lose their signal
  double worst_noise_ratio = 0; // largest rounding RMS / standard deviation seen
  // A layer under a float8 policy: each of its GEMMs' input (Layer::fp8_gemms, in order: Dense's one,
  // MultiHeadAttention's two) cast as the layer would cast it now (fp8_cast_view), and fp8_input the one of them that
  // comes nearest its limits (the larger of its shares saturated and flushed, each over its threshold below).
  bool float8 = false;
  std::vector<Fp8CastStats> fp8_gemm_inputs;
  Fp8CastStats fp8_input;
  // The largest shares of the GEMM inputs' casts in training since the last climb (Fp8CastRecord; set by the ladder,
  // not by measure_layer_numerics): a delayed scale saturates on the step after a jump only, before any climb.
  double fp8_recorded_saturated = 0, fp8_recorded_flushed = 0;
};
inline constexpr double kFp8SaturatedShare = 0.01;  // 1% of the input clamped to the format's largest value
inline constexpr double kFp8FlushedShare = 0.25;    // a quarter of the non-zero input flushed to zero
// Steps in a row whose casts saturate a layer's FP8 input past kFp8SaturatedShare before the FP8 rung climbs without
// a failure or a drift. A delayed scale saturates on the one step after a jump (its history learns the jump there);
// saturating step after step, it is behind a tensor that keeps growing, and the values it clamps are wrong however
// little the loss shows it yet.
inline constexpr int64_t kFp8SaturatedSteps = 3;
inline constexpr double kSignalLossNoiseRatio = 0.5;  // rounding noise a quarter of the column's variance
inline constexpr double kSignalLossColumns = 0.1;     // a layer loses precision when 10% of its columns do

// Runs x (rows of a batch, float32) forward through a float32 shadow of model and measures each layer; the
// model's policies, weights, state and observer are unchanged afterwards.
std::vector<LayerNumerics> measure_layer_numerics(RecoveryTarget& model, const Tensor& x);

// The layers to switch to float32, in model order: those computing in 16 bits whose finite inputs
// overflow their compute dtype, whose finite outputs or internal values overflow it (a layer whose input
// is already non-finite in float32 is downstream of the damage, not its cause); with precision, also those
// that lose precision (see LayerNumerics). Each entry: the layer's name and why, e.g. "inputs overflow".
std::vector<std::pair<std::string, std::string>> layers_to_blame(const std::vector<LayerNumerics>& layers,
                                                                 bool precision);

// What the recovery ladder changed in the model, read from a RecoveryGuard::state_json: the layers it switched to
// float32 or (from a float8 policy) to mixed_bfloat16, and whether it switched dynamic loss scaling on.
// load_checkpoint applies them before it compares the saved layer policies and optimizer with the model's, so a
// recovered run resumes as it was.
struct RecoveryModelChanges {
  std::vector<std::string> float32_layers;
  std::vector<std::string> bfloat16_layers;  // float8 layers the FP8 rung moved to mixed_bfloat16 (and no further)
  bool enabled_loss_scaling = false;
};
// Throws Error (kInvalidInput) naming what is malformed.
RecoveryModelChanges recovery_model_changes(const std::string& state_json);

class RecoveryGuard {
 public:
  explicit RecoveryGuard(RecoveryOptions options = {});

  // Called by fit(): keeps an in-memory snapshot of the model's training state at `position`.
  void snapshot(RecoveryTarget& model, const FitPosition& position);
  bool has_snapshot() const { return has_snapshot_; }
  int64_t snapshot_every() const { return options_.snapshot_every; }
  // True while no bad step happened since the last snapshot (a snapshot is only taken of a good state).
  bool healthy() const { return consecutive_failures_ == 0 && drifting_steps_ == 0 && fp8_saturated_streak_ == 0; }
  // Called by fit() after each step with that step's logs and batch; returns true when fit() must roll
  // back (call restore()). global_step is the 1-based position of the step in the training run (it
  // indexes the reference loss; after a rollback it repeats the replayed positions).
  // batch() gives the step's rows in float32 (only called when a rung needs to inspect them).
  bool after_step(RecoveryTarget& model, const Logs& step_logs, const std::function<std::pair<Tensor, Tensor>()>& batch,
                  int64_t global_step);
  // Restores the snapshot into the model and returns where fit() resumes.
  const FitPosition& restore(RecoveryTarget& model);
  // True after the last rung failed: fit() stops.
  bool gave_up() const { return gave_up_; }

  const std::vector<RecoveryEvent>& events() const { return events_; }

  // The ladder's state for a checkpoint saved during fit() (FitState::recovery): the rung reached, every event,
  // the failure and drift counters and the drift check's averages, so a resumed run climbs from where it stood
  // and its report lists the whole run's actions. The in-memory snapshots are not kept: a resumed fit() takes a
  // new one at its first step.
  std::string state_json() const;
  // Throws Error (kInvalidInput) naming what is malformed.
  void restore_state(const std::string& json);

 private:
  // A training state to return to: the weights, the optimizer's state, the random streams and the smoothed losses.
  struct Snapshot {
    FitPosition position;
    std::vector<Tensor> weights;
    NamedTensors optimizer_state;
    bool optimizer_was_scaled = false;
    std::vector<uint64_t> shuffle_state, dropout_state;
    double ema = 0, reference_ema = 0;
    bool has_ema = false, has_reference_ema = false;
  };

  void record(RecoveryEvent event);
  // Takes each float8 layer's record of casts since the last call into fp8_records_ and counts the steps in a row
  // whose casts saturated; returns why the FP8 rung must climb now (kFp8SaturatedSteps reached), or "".
  std::string watch_fp8_casts(RecoveryTarget& model);
  void record_rollback(int64_t global_step);
  // The snapshot the next restore() returns to.
  const Snapshot& rollback_target() const;
  // Updates the smoothed losses (the run's only for a finite loss); true while this run drifts above the reference.
  bool drifts(double loss, int64_t global_step);
  // Rungs 2 and 3 (switch the layers to blame, else the whole model, to float32; or give up).
  // drift: the climb is for a finite loss that left the reference, so layers losing precision are blamed too.
  bool climb(RecoveryTarget& model, const std::function<std::pair<Tensor, Tensor>()>& batch, int64_t global_step,
             const std::string& why, bool drift);

  RecoveryOptions options_;
  // The last batch whose loss or gradients were non-finite (inspected with the current one when climbing).
  std::pair<Tensor, Tensor> last_bad_batch_;
  bool has_snapshot_ = false;
  Snapshot last_;   // the latest good state
  Snapshot first_;  // the first one of the run: where a drift rolls back to
  bool restore_first_ = false;             // set by a climb for a drift
  bool restart_scale_on_restore_ = false;  // set when a rung switched layers to float32
  int64_t consecutive_failures_ = 0;
  int64_t drifting_steps_ = 0;
  double ema_ = 0, reference_ema_ = 0;  // smoothed loss of this run and of the reference
  bool has_ema_ = false, has_reference_ema_ = false;
  int rung_ = 0;
  // Per float8 layer: the largest shares of its input's casts since the last climb, and the steps in a row whose
  // casts saturated past kFp8SaturatedShare (the largest such streak in fp8_saturated_streak_). Not in state_json:
  // a resumed run counts afresh.
  std::map<std::string, Fp8CastRecord> fp8_records_;
  std::map<std::string, int64_t> fp8_saturated_steps_;
  int64_t fp8_saturated_streak_ = 0;
  bool gave_up_ = false;
  std::vector<RecoveryEvent> events_;
};

}  // namespace mixtrain
