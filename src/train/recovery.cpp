#include "mixtrain/train/recovery.h"

#include <cmath>
#include <cstdio>
#include <iostream>

#include "mixtrain/ops/elementwise.h"
#include "mixtrain/train/inspect.h"
#include "mixtrain/train/model.h"

namespace mixtrain {

namespace {
bool all_finite(const Model& m) {
  for (const Var& w : m.weights())
    if (ops::count_nonfinite(w.value()) != 0) return false;
  return true;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}
}  // namespace

RecoveryGuard::RecoveryGuard(RecoveryOptions options) : options_(options) {}

void RecoveryGuard::snapshot(Model& model, const FitPosition& position) {
  // Only a good state is worth returning to.
  if (!all_finite(model)) return;
  position_ = position;
  weights_.clear();
  for (const Var& w : model.weights()) weights_.push_back(w.value().clone());
  optimizer_state_ = model.optimizer().state();
  optimizer_was_scaled_ = model.optimizer().scales_loss();
  shuffle_state_ = model.shuffle_rng().state();
  dropout_state_ = model.dropout_rng().state();
  snapshot_ema_ = ema_;
  snapshot_reference_ema_ = reference_ema_;
  has_snapshot_ = true;
}

const FitPosition& RecoveryGuard::restore(Model& model) {
  MIXTRAIN_CHECK(has_snapshot_, "RecoveryGuard: no snapshot to roll back to");
  std::vector<Var> ws = model.weights();
  for (size_t i = 0; i < ws.size(); ++i) ws[i].set_value(weights_[i]);
  Optimizer& opt = model.optimizer();
  // A snapshot taken before loss scaling was switched on holds the inner optimizer's state only.
  if (opt.scales_loss() && !optimizer_was_scaled_)
    opt.inner_optimizer().load_state(optimizer_state_);
  else
    opt.load_state(optimizer_state_);
  model.shuffle_rng().set_state(shuffle_state_);
  model.dropout_rng().set_state(dropout_state_);
  ema_ = snapshot_ema_;
  reference_ema_ = snapshot_reference_ema_;
  consecutive_failures_ = 0;
  drifting_steps_ = 0;
  return position_;
}

void RecoveryGuard::record(RecoveryEvent e) {
  std::ostream& out = options_.log ? *options_.log : std::cerr;
  out << "recovery: step " << e.step << ": " << e.action;
  if (!e.layers.empty()) out << " [" << join(e.layers) << "]";
  out << " — " << e.reason << "\n";
  events_.push_back(std::move(e));
}

bool RecoveryGuard::after_step(Model& model, const Logs& step_logs,
                               const std::function<std::pair<Tensor, Tensor>()>& batch, int64_t global_step) {
  if (gave_up_) return false;
  const std::optional<LossScaleReport> scaler = model.optimizer().loss_scale_report();
  const bool loss_finite = std::isfinite(log_value(step_logs, "loss", NAN));
  const bool skipped = scaler && scaler->last_step_skipped;
  // Without a scaler a non-finite loss has already been applied: the weights may be poisoned.
  const bool bad = !loss_finite || skipped;
  if (!bad) {
    consecutive_failures_ = 0;
    if (!drifts(log_value(step_logs, "loss"), global_step)) return false;
    if (drifting_steps_ < options_.max_consecutive_failures) return false;
    char why[160];
    std::snprintf(why, sizeof why, "smoothed loss %.4g is %.0f%% above the float32 reference's %.4g for %lld steps",
                  ema_, 100 * (ema_ / reference_ema_ - 1), reference_ema_, static_cast<long long>(drifting_steps_));
    return climb(model, batch, global_step, why);
  }
  ++consecutive_failures_;

  // Rung 1: dynamic loss scaling on, roll back.
  if (!scaler) {
    model.enable_dynamic_loss_scaling();
    record({global_step, "enable_loss_scaling", "non-finite loss or gradients without loss scaling", {}});
    record({global_step, "rollback", "back to the last good snapshot (step " + std::to_string(position_.step) +
                                         " of epoch " + std::to_string(position_.epoch + 1) + ")", {}});
    rung_ = std::max(rung_, 1);
    return has_snapshot_;
  }
  // With a scaler, occasional skipped steps are its normal work; climb only when they persist.
  const bool stuck = scaler->stuck_at_floor;
  if (consecutive_failures_ < options_.max_consecutive_failures && !stuck) return false;
  return climb(model, batch, global_step,
               stuck ? "the loss scale is stuck at its floor"
                     : std::to_string(consecutive_failures_) + " non-finite steps in a row");
}

bool RecoveryGuard::drifts(double loss, int64_t global_step) {
  const auto& ref = options_.reference_step_loss;
  const size_t i = static_cast<size_t>(global_step - 1);
  if (i >= ref.size() || !std::isfinite(ref[i])) return false;
  constexpr double kWeight = 0.98;  // about 50 steps of memory
  ema_ = global_step == 1 ? loss : kWeight * ema_ + (1 - kWeight) * loss;
  reference_ema_ = global_step == 1 ? ref[i] : kWeight * reference_ema_ + (1 - kWeight) * ref[i];
  const bool drifting = global_step > options_.drift_warmup_steps && ema_ > reference_ema_ * (1 + options_.drift_tolerance);
  drifting_steps_ = drifting ? drifting_steps_ + 1 : 0;
  return drifting;
}

bool RecoveryGuard::climb(Model& model, const std::function<std::pair<Tensor, Tensor>()>& batch, int64_t global_step,
                          const std::string& why) {
  // Rung 2: switch the layers that break in their compute dtype on this batch.
  std::vector<std::string> culprits;
  if (rung_ < 3) {
    const auto [x, y] = batch();
    const std::vector<LayerInspection> stats = inspect_layers(model, x, y, 1, x.dim(0));
    culprits = layers_that_break(stats);
  }
  if (!culprits.empty()) {
    for (const std::string& name : culprits) model.layer(name)->set_dtype_policy(DTypePolicy::from_name("float32"));
    record({global_step, "layers_to_float32", why + "; these layers overflow or turn NaN in 16 bits", culprits});
    rung_ = std::max(rung_, 2);
  } else if (rung_ < 3) {
    std::vector<std::string> switched;
    for (auto& l : model.layers())
      if (l->compute_dtype() != DType::kFloat32) {
        switched.push_back(l->name());
        l->set_dtype_policy(DTypePolicy::from_name("float32"));
      }
    if (switched.empty()) {
      gave_up_ = true;
      record({global_step, "give_up", why + " with every layer already in float32: stopping", {}});
      model.stop_training = true;
      return false;
    }
    record({global_step, "model_to_float32", why + "; no single layer to blame", switched});
    rung_ = 3;
  } else {
    gave_up_ = true;
    record({global_step, "give_up", why + " after reverting the model to float32: stopping", {}});
    model.stop_training = true;
    return false;
  }
  record({global_step, "rollback", "back to the last good snapshot (step " + std::to_string(position_.step) +
                                       " of epoch " + std::to_string(position_.epoch + 1) + ")", {}});
  return has_snapshot_;
}

}  // namespace mixtrain
