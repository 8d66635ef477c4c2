#include "mixtrain/train/recovery.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/core/half.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/transfer.h"
#include "mixtrain/precision/fp8_gemm_scales.h"
#include "mixtrain/train/float32_shadow.h"

namespace mixtrain {

namespace {
bool all_finite(Network& m) {
  for (const Var& w : m.weights())
    if (ops::count_nonfinite(w.value()) != 0) return false;
  return true;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// x rounded to a 16-bit dtype and read back; float32 is returned unchanged.
float round_to(float x, DType d) {
  if (d == DType::kFloat16) return half_bits_to_float(float_to_half_bits(x));
  if (d == DType::kBFloat16) return bf16_bits_to_float(float_to_bf16_bits(x));
  return x;
}

// Per column (last axis) of t: the RMS of the rounding error against the column's standard deviation over
// the rows. Non-finite values and values that overflow (a range problem, counted by RangeStats) are left out.
void add_column_rounding(const Tensor& t, DType d, LayerNumerics& n) {
  if (t.rank() == 0 || t.numel() == 0) return;
  const int64_t cols = t.rank() >= 2 ? t.dim(static_cast<int>(t.rank()) - 1) : 1;
  const int64_t rows = t.numel() / cols;
  if (rows < 2) return;
  const std::vector<float> v = ops::to_device(t, Device::cpu()).to_floats();  // (rows, cols), from the model's device
  std::vector<double> sum(static_cast<size_t>(cols), 0), count(static_cast<size_t>(cols), 0);
  auto usable = [&](float x) { return std::isfinite(x) && std::isfinite(round_to(x, d)); };
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float x = v[static_cast<size_t>(r * cols + c)];
      if (!usable(x)) continue;
      sum[static_cast<size_t>(c)] += x;
      count[static_cast<size_t>(c)] += 1;
    }
  std::vector<double> var(static_cast<size_t>(cols), 0), noise(static_cast<size_t>(cols), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const auto k = static_cast<size_t>(c);
      const float x = v[static_cast<size_t>(r * cols + c)];
      if (!usable(x)) continue;
      const double dev = x - sum[k] / count[k], err = static_cast<double>(round_to(x, d)) - x;
      var[k] += dev * dev;
      noise[k] += err * err;
    }
  for (size_t k = 0; k < var.size(); ++k) {
    if (count[k] < 2 || var[k] <= 0) continue;
    const double ratio = std::sqrt(noise[k] / var[k]);  // the 1/count factors cancel
    ++n.columns;
    if (ratio >= kSignalLossNoiseRatio) ++n.lost_columns;
    n.worst_noise_ratio = std::max(n.worst_noise_ratio, ratio);
  }
}

class NumericsObserver : public LayerObserver {
 public:
  // float8: the layers under a float8 policy and that policy (the shadow runs them in float32).
  NumericsObserver(std::map<const Layer*, LayerNumerics>& out, const std::map<const Layer*, DTypePolicy>& float8)
      : out_(out), float8_(float8) {}
  void on_input(const Layer& l, const Var& x) override {
    add(l, x.value(), true);
    add_fp8_input(l, x.value(), [](const Fp8Gemm& g) { return g.reads_layer_input; });
  }
  void on_fp8_operand(const Layer& l, std::string_view gemm, std::string_view tensor, const Tensor& value) override {
    if (tensor == "input") add_fp8_input(l, value, [&](const Fp8Gemm& g) { return g.name == gemm; });
  }
  void on_output(const Layer& l, const Var& y) override { add(l, y.value(), false); }
  void on_internal(const Layer& l, std::string_view, const Tensor& value) override {
    auto it = out_.find(&l);
    if (it != out_.end() && is_float(value.dtype()))
      it->second.internal.merge(range_stats(value, it->second.compute_dtype));
  }

 private:
  void add(const Layer& l, const Tensor& t, bool input) {
    auto it = out_.find(&l);
    // Integer inputs (token ids) are never cast to a 16-bit dtype.
    if (it == out_.end() || !t.defined() || !is_float(t.dtype())) return;
    LayerNumerics& n = it->second;
    (input ? n.inputs : n.outputs).merge(range_stats(t, n.compute_dtype));
    if (n.compute_dtype != DType::kFloat32) add_column_rounding(t, n.compute_dtype, n);
  }
  // The cast of t as the input of each of l's FP8 GEMMs that `reads` it, when l is under a float8 policy.
  template <typename Reads>
  void add_fp8_input(const Layer& l, const Tensor& t, Reads reads) {
    auto f = float8_.find(&l);
    if (f == float8_.end() || !t.defined() || !is_float(t.dtype())) return;
    const std::vector<Fp8Gemm> gemms = l.fp8_gemms();
    const std::vector<float> host = ops::to_device(t, Device::cpu()).to_floats();
    for (size_t i = 0; i < gemms.size(); ++i) {
      if (!reads(gemms[i])) continue;
      const Fp8CastView v = fp8_cast_view(*gemms[i].scales, f->second, "input", host, t.rank() > 0 ? t.dim(-1) : 1);
      out_.at(&l).fp8_gemm_inputs.at(i).merge(v.stats);
    }
  }
  std::map<const Layer*, LayerNumerics>& out_;
  const std::map<const Layer*, DTypePolicy>& float8_;
};

// How near a cast comes to the FP8 rung's limits: the larger of its shares saturated and flushed, each over its
// threshold (1 or more: the layer is blamed).
double fp8_damage(const Fp8CastStats& s) {
  return std::max(s.saturated_fraction() / kFp8SaturatedShare, s.flushed_fraction() / kFp8FlushedShare);
}

// Sets n.fp8_input to the GEMM input that comes nearest the limits (the first of equals).
void pick_worst_fp8_input(LayerNumerics& n) {
  n.fp8_input = {};
  for (const Fp8CastStats& s : n.fp8_gemm_inputs)
    if (n.fp8_input.count == 0 || fp8_damage(s) > fp8_damage(n.fp8_input)) n.fp8_input = s;
}

// Sets each float8 layer's recorded shares from the records of its casts since the last climb (taken from the layers
// into `records` by RecoveryGuard::watch_fp8_casts), and clears them: the next climb judges the casts after this one.
void take_fp8_records(std::map<std::string, Fp8CastRecord>& records, std::vector<LayerNumerics>& stats) {
  for (LayerNumerics& n : stats) {
    auto it = records.find(n.layer);
    if (it == records.end() || !n.float8) continue;
    n.fp8_recorded_saturated = it->second.saturated;
    n.fp8_recorded_flushed = it->second.flushed;
  }
  records.clear();
}

void merge_numerics(std::vector<LayerNumerics>& into, const std::vector<LayerNumerics>& from) {
  for (size_t i = 0; i < into.size() && i < from.size(); ++i) {
    into[i].inputs.merge(from[i].inputs);
    into[i].outputs.merge(from[i].outputs);
    into[i].internal.merge(from[i].internal);
    into[i].columns += from[i].columns;
    into[i].lost_columns += from[i].lost_columns;
    into[i].worst_noise_ratio = std::max(into[i].worst_noise_ratio, from[i].worst_noise_ratio);
    for (size_t g = 0; g < into[i].fp8_gemm_inputs.size() && g < from[i].fp8_gemm_inputs.size(); ++g)
      into[i].fp8_gemm_inputs[g].merge(from[i].fp8_gemm_inputs[g]);
    pick_worst_fp8_input(into[i]);
  }
}
}  // namespace

std::vector<double> drift_smoothed(const std::vector<double>& loss) {
  std::vector<double> out;
  out.reserve(loss.size());
  double ema = 0;
  for (size_t i = 0; i < loss.size(); ++i) {
    ema = i == 0 ? loss[i] : kDriftSmoothing * ema + (1 - kDriftSmoothing) * loss[i];
    out.push_back(ema);
  }
  return out;
}

std::vector<double> drift_reference_for_ceiling(const std::vector<double>& ceiling, double drift_tolerance) {
  MIXTRAIN_CHECK(drift_tolerance > -1, "drift_reference_for_ceiling: drift_tolerance must be above -1, got "
                                           << drift_tolerance);
  // Inverts drift_smoothed: the reference's smoothed value at step t must be ceiling[t] / (1 + tolerance).
  std::vector<double> ref;
  const double scale = 1 + drift_tolerance;
  for (size_t i = 0; i < ceiling.size() && std::isfinite(ceiling[i]); ++i)
    ref.push_back(i == 0 ? ceiling[0] / scale
                         : (ceiling[i] - kDriftSmoothing * ceiling[i - 1]) / ((1 - kDriftSmoothing) * scale));
  return ref;
}

std::vector<LayerNumerics> measure_layer_numerics(RecoveryTarget& model, const Tensor& x) {
  MIXTRAIN_CHECK(model.compiled(), "measure_layer_numerics: compile the model first");
  MIXTRAIN_CHECK(x.defined() && x.rank() >= 1 && x.dim(0) > 0,
                 "measure_layer_numerics: x " << x.describe() << " needs at least one row");
  std::map<const Layer*, LayerNumerics> stats;
  std::map<const Layer*, DTypePolicy> float8;
  for (auto& l : model.network().layers()) {
    LayerNumerics n;
    n.layer = l->name();
    n.compute_dtype = l->compute_dtype();
    n.float8 = l->dtype_policy().uses_float8() && !l->fp8_gemms().empty();
    if (n.float8) float8.emplace(l.get(), l->dtype_policy());
    if (n.float8) n.fp8_gemm_inputs.resize(l->fp8_gemms().size());
    stats.emplace(l.get(), n);
  }
  NumericsObserver observer(stats, float8);
  Float32Shadow shadow(model.network(), &observer);
  {
    // Inference mode: no dropout draws and no moving-statistics updates, so training replays unchanged.
    NoGradGuard no_grad;
    // Integer inputs (token ids) stay integers: the layers that read them keep them, the others cast.
    model.network().call(Var(ops::to_device(x, model.network().device())), CallContext{});
  }
  std::vector<LayerNumerics> out;
  for (auto& l : model.network().layers()) {
    out.push_back(stats.at(l.get()));
    pick_worst_fp8_input(out.back());
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> layers_to_blame(const std::vector<LayerNumerics>& layers,
                                                                 bool precision) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const LayerNumerics& l : layers) {
    if (l.compute_dtype == DType::kFloat32) continue;
    const bool finite_inputs = l.inputs.nan == 0 && l.inputs.inf == 0;
    std::vector<std::string> why;
    if (l.inputs.overflow > 0) why.push_back("inputs overflow");
    if (finite_inputs && l.outputs.overflow > 0) why.push_back("outputs overflow");
    if (finite_inputs && l.internal.overflow > 0) why.push_back("internal values overflow");
    if (precision && finite_inputs && l.columns > 0 &&
        static_cast<double>(l.lost_columns) >= kSignalLossColumns * static_cast<double>(l.columns)) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "loses precision (%lld of %lld columns, rounding noise up to %.2g of the spread)",
                    static_cast<long long>(l.lost_columns), static_cast<long long>(l.columns), l.worst_noise_ratio);
      why.push_back(buf);
    }
    const double saturated = std::max(l.fp8_input.saturated_fraction(), l.fp8_recorded_saturated);
    const double flushed = std::max(l.fp8_input.flushed_fraction(), l.fp8_recorded_flushed);
    if (l.float8 && (saturated >= kFp8SaturatedShare || flushed >= kFp8FlushedShare)) {
      char buf[200];
      std::snprintf(buf, sizeof buf, "FP8 input saturates %.2g%%, flushes %.2g%% to zero (%.2g%%, %.2g%% now)",
                    saturated * 100, flushed * 100, l.fp8_input.saturated_fraction() * 100,
                    l.fp8_input.flushed_fraction() * 100);
      why.push_back(buf);
    }
    if (!why.empty()) out.emplace_back(l.layer, join(why));
  }
  return out;
}

RecoveryOptions recovery_options_for_run(int64_t total_steps) {
  RecoveryOptions o;
  const int64_t fifth = std::max<int64_t>(total_steps / 5, 5);
  o.drift_warmup_steps = std::min(o.drift_warmup_steps, fifth);
  o.max_consecutive_failures = std::min(o.max_consecutive_failures, fifth);
  return o;
}

std::string recovery_timing_text(const RecoveryOptions& options) {
  return "the drift check starts after step " + std::to_string(options.drift_warmup_steps) +
         "; a rung is climbed after " + std::to_string(options.max_consecutive_failures) +
         " failed or drifting steps in a row";
}

RecoveryGuard::RecoveryGuard(RecoveryOptions options) : options_(options) {}

void RecoveryGuard::snapshot(RecoveryTarget& model, const FitPosition& position) {
  // The FP8 layers record their input casts for the FP8 rung from the first snapshot on (cheap to repeat).
  for (auto& l : model.network().layers())
    for (const Fp8Gemm& g : l->fp8_gemms()) g.scales->record_input_casts(true);
  // Only a good state is worth returning to.
  if (!all_finite(model.network())) return;
  last_.position = position;
  last_.weights.clear();
  for (const Var& w : model.network().weights()) last_.weights.push_back(w.value().clone());
  last_.optimizer_state = model.optimizer().state();
  last_.optimizer_was_scaled = model.optimizer().scales_loss();
  last_.shuffle_state = model.shuffle_rng().state();
  last_.dropout_state = model.dropout_rng().state();
  last_.ema = ema_;
  last_.reference_ema = reference_ema_;
  last_.has_ema = has_ema_;
  last_.has_reference_ema = has_reference_ema_;
  if (!has_snapshot_) first_ = last_;  // its tensors are never written: sharing them with last_ is safe
  has_snapshot_ = true;
}

const RecoveryGuard::Snapshot& RecoveryGuard::rollback_target() const { return restore_first_ ? first_ : last_; }

const FitPosition& RecoveryGuard::restore(RecoveryTarget& model) {
  MIXTRAIN_CHECK(has_snapshot_, "RecoveryGuard: no snapshot to roll back to");
  const Snapshot& snap = rollback_target();
  std::vector<Var> ws = model.network().weights();
  // Copies: the snapshot must survive the training that follows, for the next rollback.
  for (size_t i = 0; i < ws.size(); ++i) ws[i].set_value(snap.weights[i].clone());
  Optimizer& opt = model.optimizer();
  // A snapshot taken before loss scaling was switched on holds the inner optimizer's state only.
  if (opt.scales_loss() && !snap.optimizer_was_scaled)
    opt.inner_optimizer().load_state(snap.optimizer_state);
  else
    opt.load_state(snap.optimizer_state);
  if (restart_scale_on_restore_) opt.restart_loss_scale();
  restart_scale_on_restore_ = false;
  model.shuffle_rng().set_state(snap.shuffle_state);
  model.dropout_rng().set_state(snap.dropout_state);
  ema_ = snap.ema;
  reference_ema_ = snap.reference_ema;
  has_ema_ = snap.has_ema;
  has_reference_ema_ = snap.has_reference_ema;
  consecutive_failures_ = 0;
  drifting_steps_ = 0;
  fp8_saturated_steps_.clear();
  fp8_saturated_streak_ = 0;
  last_bad_batch_ = {};
  if (restore_first_) last_ = first_;  // later snapshots belong to the abandoned run
  restore_first_ = false;
  return snap.position;
}

void RecoveryGuard::record(RecoveryEvent e) {
  std::ostream& out = options_.log ? *options_.log : std::cerr;
  out << "recovery: step " << e.step << ": " << e.action;
  if (!e.layers.empty()) out << " [" << join(e.layers) << "]";
  out << " — " << e.reason << "\n";
  events_.push_back(std::move(e));
}

void RecoveryGuard::record_rollback(int64_t global_step) {
  const FitPosition& to = rollback_target().position;
  RecoveryEvent e{global_step, "rollback",
                  std::string(restore_first_ ? "back to the first snapshot of the run" : "back to the last good snapshot") +
                      " (step " + std::to_string(to.step) + " of epoch " + std::to_string(to.epoch + 1) + ")",
                  {}};
  e.resume_step = static_cast<int64_t>(to.history_steps);
  record(std::move(e));
}

std::string RecoveryGuard::watch_fp8_casts(RecoveryTarget& model) {
  std::string why;
  fp8_saturated_streak_ = 0;
  for (auto& l : model.network().layers()) {
    const std::vector<Fp8Gemm> gemms = l->fp8_gemms();
    if (gemms.empty()) continue;
    Fp8CastRecord r;  // the worst of the layer's GEMM inputs (attention has two)
    for (const Fp8Gemm& g : gemms) {
      const Fp8CastRecord one = g.scales->take_input_record();
      r.saturated = std::max(r.saturated, one.saturated);
      r.flushed = std::max(r.flushed, one.flushed);
      r.casts += one.casts;
    }
    Fp8CastRecord& since = fp8_records_[l->name()];
    since.saturated = std::max(since.saturated, r.saturated);
    since.flushed = std::max(since.flushed, r.flushed);
    since.casts += r.casts;
    int64_t& streak = fp8_saturated_steps_[l->name()];
    if (r.casts > 0) streak = r.saturated >= kFp8SaturatedShare ? streak + 1 : 0;  // a step without casts leaves it
    fp8_saturated_streak_ = std::max(fp8_saturated_streak_, streak);
    if (why.empty() && streak >= kFp8SaturatedSteps)
      why = l->name() + "'s FP8 input has saturated past " + std::to_string(static_cast<int>(kFp8SaturatedShare * 100)) +
            "% on " + std::to_string(streak) + " steps in a row";
  }
  return why;
}

bool RecoveryGuard::after_step(RecoveryTarget& model, const Logs& step_logs,
                               const std::function<std::pair<Tensor, Tensor>()>& batch, int64_t global_step) {
  if (gave_up_) return false;
  const std::string saturating = watch_fp8_casts(model);
  const std::optional<LossScaleReport> scaler = model.optimizer().loss_scale_report();
  const double loss = log_value(step_logs, "loss", NAN);
  const bool loss_finite = std::isfinite(loss);
  const bool skipped = scaler && scaler->last_step_skipped;
  // Without a scaler a non-finite loss has already been applied: the weights may be poisoned.
  const bool bad = !loss_finite || skipped;
  const bool drifting = drifts(bad ? NAN : loss, global_step);
  if (!bad) {
    consecutive_failures_ = 0;
    if (!drifting || drifting_steps_ < options_.max_consecutive_failures)
      return !saturating.empty() && climb(model, batch, global_step, saturating, /*drift=*/false);
    char why[200];
    std::snprintf(why, sizeof why,
                  "smoothed loss %.4g has stayed above the limit set by the float32 reference (%.4g) for %lld steps",
                  ema_, reference_ema_ * (1 + options_.drift_tolerance), static_cast<long long>(drifting_steps_));
    return climb(model, batch, global_step, why, /*drift=*/true);
  }
  ++consecutive_failures_;
  last_bad_batch_ = batch();

  // Rung 1: dynamic loss scaling on, roll back.
  if (!scaler) {
    model.enable_dynamic_loss_scaling();
    record({global_step, "enable_loss_scaling", "non-finite loss or gradients without loss scaling", {}});
    record_rollback(global_step);
    rung_ = std::max(rung_, 1);
    return has_snapshot_;
  }
  // With a scaler, occasional skipped steps are its normal work; climb only when they persist.
  const bool stuck = scaler->stuck_at_floor;
  if (consecutive_failures_ < options_.max_consecutive_failures && !stuck) return false;
  return climb(model, batch, global_step,
               stuck ? "the loss scale is stuck at its floor"
                     : std::to_string(consecutive_failures_) + " non-finite steps in a row",
               /*drift=*/false);
}

bool RecoveryGuard::drifts(double loss, int64_t global_step) {
  const auto& ref = options_.reference_step_loss;
  const size_t i = static_cast<size_t>(global_step - 1);
  if (i >= ref.size() || !std::isfinite(ref[i])) return false;
  // The reference's average follows its curve on every step; the run's only its finite steps.
  reference_ema_ = has_reference_ema_ ? kDriftSmoothing * reference_ema_ + (1 - kDriftSmoothing) * ref[i] : ref[i];
  has_reference_ema_ = true;
  if (!std::isfinite(loss)) return false;
  ema_ = has_ema_ ? kDriftSmoothing * ema_ + (1 - kDriftSmoothing) * loss : loss;
  has_ema_ = true;
  const bool drifting = global_step > options_.drift_warmup_steps && ema_ > reference_ema_ * (1 + options_.drift_tolerance);
  drifting_steps_ = drifting ? drifting_steps_ + 1 : 0;
  return drifting;
}

bool RecoveryGuard::climb(RecoveryTarget& model, const std::function<std::pair<Tensor, Tensor>()>& batch, int64_t global_step,
                          const std::string& why, bool drift) {
  // Rung 2: switch the layers to blame on the failing batches: this step's, and for a drift also the last one
  // whose loss or gradients were non-finite (an occasional overflow that collapsed the loss scale).
  std::vector<std::pair<std::string, std::string>> blamed;
  if (rung_ < 3) {
    std::vector<LayerNumerics> stats = measure_layer_numerics(model, batch().first);
    if (drift && last_bad_batch_.first.defined())
      merge_numerics(stats, measure_layer_numerics(model, last_bad_batch_.first));
    take_fp8_records(fp8_records_, stats);
    blamed = layers_to_blame(stats, /*precision=*/drift);
  }
  fp8_saturated_steps_.clear();
  fp8_saturated_streak_ = 0;
  if (!blamed.empty()) {
    // The FP8 rung: a layer under a float8 policy moves to mixed_bfloat16 first, the others (and a layer the FP8
    // rung moved that is blamed again) to float32.
    std::vector<std::string> to_bf16, to_f32;
    std::string bf16_details, f32_details;
    for (const auto& [name, cause] : blamed) {
      Layer* l = model.network().layer(name);
      const bool float8 = l->dtype_policy().uses_float8();
      (float8 ? to_bf16 : to_f32).push_back(name);
      std::string& details = float8 ? bf16_details : f32_details;
      details += (details.empty() ? "" : "; ") + name + ": " + cause;
      l->set_dtype_policy(DTypePolicy::from_name(float8 ? "mixed_bfloat16" : "float32"));
    }
    if (!to_bf16.empty())
      record({global_step, "layers_to_bfloat16", why + "; these layers do not fit 8 bits (" + bf16_details + ")",
              to_bf16});
    if (!to_f32.empty())
      record({global_step, "layers_to_float32", why + "; these layers do not fit 16 bits (" + f32_details + ")",
              to_f32});
    rung_ = std::max(rung_, 2);
  } else if (rung_ < 3) {
    std::vector<std::string> switched;
    for (auto& l : model.network().layers())
      if (l->compute_dtype() != DType::kFloat32) {
        switched.push_back(l->name());
        l->set_dtype_policy(DTypePolicy::from_name("float32"));
      }
    if (switched.empty()) {
      gave_up_ = true;
      record({global_step, "give_up", why + " with every layer already in float32: stopping", {}});
      model.request_stop();
      return false;
    }
    record({global_step, "model_to_float32", why + "; no single layer to blame", switched});
    rung_ = 3;
  } else {
    gave_up_ = true;
    record({global_step, "give_up", why + " after reverting the model to float32: stopping", {}});
    model.request_stop();
    return false;
  }
  restart_scale_on_restore_ = true;
  // A drift has no first bad step to date it: every snapshot since the start may already hold its damage (the
  // steps skipped while the loss scale collapsed, the precision lost), so it starts over from the first one.
  restore_first_ = drift;
  record_rollback(global_step);
  return has_snapshot_;
}

}  // namespace mixtrain
