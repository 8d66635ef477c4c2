// LossScaleOptimizer: dynamic loss scaling for float16 training (Keras 3 semantics, plus a floor, a ceiling,
// hysteresis and a stuck-at-floor alarm).
//
// float16 gradients underflow (below 6e-8 they become 0). Multiplying the loss by a large scale S multiplies every
// gradient by S and keeps them representable; the optimizer divides them by S again before the update. If S is too
// large, some gradient overflows to inf: that step is skipped (variables and optimizer state untouched) and S is
// halved. After dynamic_growth_steps finite steps in a row S doubles, probing for the largest safe scale.
//
// The training step (Model::train_step) on a ParameterArena:
//   arena.zero_grad();
//   backward(loss, opt.scale_loss(Tensor::full(loss.shape(), DType::kFloat32, 1.0f)));  // seed S: scaled loss
//   opt.apply_arena(arena);  // one fused unscale + finite check over the flat gradients, then update or skip
// A custom loop (Keras' scale_loss + GradientTape; autograd/gradient_tape.h):
//   GradientTape tape;
//   Var loss = sparse_categorical_crossentropy(model.call(Var(x), ctx), y, /*from_logits=*/true);
//   std::vector<Tensor> scaled_grads = tape.gradient(opt.scale_loss(loss), vars);  // gradients of loss * S
//   opt.apply(scaled_grads, vars);  // unscales, checks, updates or skips, adjusts the scale
// Custom loops that clip or inspect unscaled gradients:
//   bool finite;
//   std::vector<Tensor> g = opt.get_unscaled_gradients(scaled_grads, &finite);
//   clip_by_global_norm(g, 1.0f);
//   opt.apply_unscaled(g, vars, finite);
// (tests/train/header_examples_test.cpp compiles and runs these lines.)
//
// The scale, its counters and the found_inf flag of the last step live in small tensors (scale_state(),
// counter_state(), found_inf()). apply_arena() chains three ops on them and reads nothing back: the unscale pass
// raises the flag, the inner optimizer's fused update reads it and skips, and ops::update_loss_scale moves the
// scale (ops/loss_scale.h). The accessors below read the tensors for logs; the floor alarm is told when the
// counters are read on the host (after each step when they live in host memory).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/ops/loss_scale.h"
#include "mixtrain/optim/optimizer.h"

namespace mixtrain {

struct LossScaleOptions {
  // Starting scale (Keras: 2^15). Must lie within [min_scale, max_scale] in dynamic mode.
  float initial_scale = 32768.0f;
  // Finite steps in a row after which the scale doubles (Keras: 2000).
  int64_t dynamic_growth_steps = 2000;
  // false: fixed-scale mode. The scale stays initial_scale forever; non-finite steps are still skipped.
  bool dynamic = true;
  // The scale never halves below this. May be below 1: some models need scales like 1e-3 (Keras 3 has no floor
  // and can reach 0; tf.keras stops at 1). 2^-14 keeps 1/scale = 2^14 exactly representable.
  float min_scale = 1.0f / 16384.0f;
  // The scale never doubles above this (2^24, as Apex), nor to a non-finite value.
  float max_scale = 16777216.0f;
  // Overflows tolerated before halving; every overflow still skips its step. The tolerance is spent once and
  // refills each time a growth interval completes, so one spurious overflow after a growth does not undo it
  // (DeepSpeed's hysteresis). 1 = halve on every overflow (Keras).
  int hysteresis = 1;
  // After this many consecutive skipped steps with the scale already at min_scale (or any scale in fixed mode),
  // on_event fires once and stuck_at_floor() becomes true until a finite step. Lowering the scale cannot fix a
  // NaN that comes from the forward pass or the data; this makes such endless skipping visible. 0 disables.
  int64_t floor_alarm_steps = 50;
  // false (Keras 3): a skipped step does not advance iterations(), so learning-rate schedules and Adam's bias
  // correction count only applied updates. true (tf.keras 2): every step, skipped or not, advances iterations(),
  // keeping schedules aligned with the step count and batches seen.
  bool skipped_steps_advance_iterations = false;
  // Receives human-readable notices (currently: the stuck-at-floor alarm). May be empty.
  std::function<void(const std::string&)> on_event = nullptr;
};

class LossScaleOptimizer : public Optimizer {
 public:
  // Wraps `inner` (which must not itself be a LossScaleOptimizer). Throws Error on invalid options.
  explicit LossScaleOptimizer(std::unique_ptr<Optimizer> inner, LossScaleOptions options = {});

  // The current loss scale S (read from the state tensor).
  float loss_scale() const;
  // Same value, under the name Keras uses for a static scale factor.
  float scale_loss_factor() const { return loss_scale(); }
  // loss * S as a new float32 tensor (float16/bfloat16 losses are converted first so the product cannot overflow).
  Tensor scale_loss(const Tensor& loss) const override;
  // loss * S on a recorded loss (Keras' scale_loss in a custom loop): a float32 Var whose gradients, e.g.
  // tape.gradient(opt.scale_loss(loss), vars), are the scaled ones that apply() or get_unscaled_gradients() take.
  Var scale_loss(const Var& loss) const override;
  bool scales_loss() const override { return true; }
  float loss_scale_for_logs() const override { return loss_scale(); }
  Tensor loss_scale_on(const Device& device) const override {
    place_state(device);
    return scale_state_.slice(0, 0, 1);
  }
  std::optional<LossScaleReport> loss_scale_report() const override;
  // Dynamic scaling from initial_scale again: the growth and hysteresis counters and the floor alarm restart;
  // the skipped-step count and the smallest scale seen keep their history. The inner optimizer is untouched.
  void restart_loss_scale() override;

  // One step on the arena's flat gradients, which hold gradients of the scaled loss (variables without a gradient
  // since arena.zero_grad() are zero there). One fused pass per dtype group unscales (g * (1/S), S read from
  // scale_state(), 1/S computed in double and rounded once) and raises found_inf() on inf/NaN
  // (ops::unscale_and_check): float32 buffers in place, 16-bit ones into float32 copies. The inner optimizer's
  // fused update reads the flag: all finite, it updates (clipping sees unscaled gradients); otherwise it changes
  // nothing, and values, compute copies and slots stay bit-identical. ops::update_loss_scale then moves the scale
  // on the same flag. No value is read back to the host. The result equals apply() with the variables' gradients.
  void apply_arena(ParameterArena& arena) override;
  bool supports_arena() const override { return inner_->supports_arena(); }

  // One step from SCALED gradients (float32, float16 or bfloat16; undefined = no gradient for that variable).
  // Each tensor is unscaled into float32 (g * (1/S), 1/S computed in double and rounded once) and checked for
  // inf/NaN in the same pass. All finite: the inner optimizer applies them and the growth counter advances.
  // Otherwise the step is skipped: variables and inner state stay bit-identical, and the scale backs off.
  void apply(const std::vector<Tensor>& grads, const std::vector<Var>& vars) override;

  // Unscales without applying, for custom loops. *all_finite (if not null) says whether every element is finite.
  std::vector<Tensor> get_unscaled_gradients(const std::vector<Tensor>& scaled, bool* all_finite = nullptr) const;
  // The second half of apply(): takes float32 gradients that are already unscaled (and perhaps clipped), and
  // applies or skips them according to all_finite, updating the scale exactly as apply() does.
  void apply_unscaled(const std::vector<Tensor>& grads, const std::vector<Var>& vars, bool all_finite);

  // Whether the most recent step was skipped.
  bool last_step_skipped() const { return counter(kLastSkipped) != 0; }
  // Skipped steps since construction (or as restored by load_state).
  int64_t skipped_steps() const { return counter(kSkipped); }
  // Finite steps since the last skipped one.
  int64_t good_steps_in_a_row() const { return counter(kGood); }
  // The smallest scale used so far.
  float min_scale_seen() const;
  // True once the floor alarm has fired, until the next finite step.
  bool stuck_at_floor() const { return counter(kStuck) != 0; }
  // Whether every unscaled gradient of the most recent step was finite.
  bool last_step_all_finite() const { return counter(kAllFinite) != 0; }

  // The state tensors: float32 (2,) = {scale, min_scale_seen}; int32 (kNumCounters,) indexed by Counter.
  const Tensor& scale_state() const { return scale_state_; }
  const Tensor& counter_state() const { return counters_; }
  // The found_inf flag of the last step: float32 (1,), nonzero when a gradient was inf or NaN.
  const Tensor& found_inf() const { return found_inf_; }
  Tensor last_skip_flag() const override { return found_inf_; }
  enum Counter : int {
    kGrowth = ops::kLsGrowth,  // finite steps since the last growth or skip
    kHysteresisLeft = ops::kLsHysteresisLeft,  // overflows still tolerated before halving
    kSkipped = ops::kLsSkipped,
    kGood = ops::kLsGood,
    kFloorSkips = ops::kLsFloorSkips,  // consecutive skipped steps taken at the floor
    kLastSkipped = ops::kLsLastSkipped,
    kStuck = ops::kLsStuck,
    kAllFinite = ops::kLsAllFinite,  // the last step's gradients were all finite
    kAlarms = ops::kLsAlarms,        // floor alarms raised (not in checkpoints)
    kNumCounters = ops::kLsNumCounters
  };

  Optimizer& inner() { return *inner_; }
  const Optimizer& inner() const { return *inner_; }
  Optimizer& inner_optimizer() override { return *inner_; }
  const Optimizer& inner_optimizer() const override { return *inner_; }
  const LossScaleOptions& options() const { return options_; }

  // Learning rate, its schedule, iterations and clipping belong to the inner optimizer (clipping sees unscaled
  // gradients). A skipped step leaves iterations(), and so the schedule, where they were unless
  // skipped_steps_advance_iterations (Keras 3: the wrapper's iterations are the inner optimizer's, which count
  // applied updates only).
  float learning_rate() const override { return inner_->learning_rate(); }
  void set_learning_rate(float learning_rate) override { inner_->set_learning_rate(learning_rate); }
  void set_learning_rate_schedule(std::shared_ptr<const LearningRateSchedule> schedule) override {
    inner_->set_learning_rate_schedule(std::move(schedule));
  }
  std::shared_ptr<const LearningRateSchedule> learning_rate_schedule() const override {
    return inner_->learning_rate_schedule();
  }
  int64_t iterations() const override { return inner_->iterations(); }
  void set_iterations(int64_t iterations) override { inner_->set_iterations(iterations); }
  std::optional<float> global_clipnorm() const override { return inner_->global_clipnorm(); }
  void set_global_clipnorm(std::optional<float> clip_norm) override { inner_->set_global_clipnorm(clip_norm); }
  int64_t gradient_accumulation_steps() const override { return inner_->gradient_accumulation_steps(); }
  void set_gradient_accumulation_steps(int64_t steps) override { inner_->set_gradient_accumulation_steps(steps); }

  std::string name() const override { return "loss_scale_optimizer"; }
  DType state_dtype() const override { return inner_->state_dtype(); }

  // The inner optimizer's state plus "loss_scale/scale" (float32) and the counters "loss_scale/counter",
  // "loss_scale/hysteresis_left", "loss_scale/skipped_steps", "loss_scale/good_steps_in_a_row",
  // "loss_scale/floor_skips", "loss_scale/last_step_skipped", "loss_scale/stuck_at_floor" (int32, shape (1,)) and
  // "loss_scale/min_scale_seen" (float32): a checkpoint resumes bit-identically.
  NamedTensors state() const override;
  // Restores state(); "loss_scale/scale" and "loss_scale/counter" are required. Unchanged when it throws.
  void load_state(const NamedTensors& state) override;

 protected:
  // apply() is overridden whole; the base per-variable hook is never reached.
  void update(float* value, const float* grad, int64_t n, const std::string& var_key) override;
  std::vector<std::string> slot_names() const override { return {}; }

 private:
  void check_pairs(const std::vector<Tensor>& grads, const std::vector<Var>& vars) const;
  // Unscales into float32; stops at the first non-finite tensor when stop_early (the step is skipped anyway).
  std::vector<Tensor> unscale(const std::vector<Tensor>& scaled, bool stop_early, bool* all_finite) const;
  // Runs apply_inner when all_finite (bookkeeping follows only a successful update), else skips; then adjusts
  // the scale and counters through the same op as apply_arena().
  void finish_step(bool all_finite, const std::function<void()>& apply_inner);
  // The rule ops::update_loss_scale applies, from options_.
  ops::LossScaleRule rule() const;
  // Tells the floor alarms raised since the last call (on_event, or stderr), reading the counters on the host.
  void tell_alarms() const;
  int64_t counter(Counter c) const;
  // Writable in host memory: moves the state there first (the next step on a device moves it back).
  int32_t& counter_ref(Counter c);
  float* scale_ref();
  // Moves the three state tensors to `device` when they live elsewhere: they follow the loss and the arena, so a
  // model moved to a GPU keeps its scale, counters and flag there and a step reads none of them on the host.
  void place_state(const Device& device) const;
  // The state tensors as host tensors (copies when on a device), for reading.
  Tensor host_scale_state() const;
  Tensor host_counters() const;

  std::unique_ptr<Optimizer> inner_;
  LossScaleOptions options_;
  // Mutable: place_state moves them without changing what they hold.
  mutable Tensor scale_state_;  // float32 (2,): scale, min_scale_seen
  mutable Tensor counters_;     // int32 (kNumCounters,)
  mutable Tensor found_inf_;    // float32 (1,)
  mutable int64_t alarms_told_ = 0;
};

}  // namespace mixtrain
