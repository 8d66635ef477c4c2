#include "mixtrain/precision/loss_scale_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "mixtrain/autograd/functions.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/loss_scale.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain {

namespace {

constexpr const char* kPrefix = "loss_scale/";

float checked_inner_lr(const std::unique_ptr<Optimizer>& inner) {
  MIXTRAIN_CHECK(inner != nullptr, "LossScaleOptimizer: the inner optimizer is null");
  return inner->learning_rate();
}

Tensor int_entry(int64_t value) {
  MIXTRAIN_CHECK(value >= 0 && value <= std::numeric_limits<int32_t>::max(),
                 "LossScaleOptimizer: counter " << value << " does not fit the int32 checkpoint entry");
  return Tensor::from_ints({1}, {static_cast<int32_t>(value)});
}

}  // namespace

LossScaleOptimizer::LossScaleOptimizer(std::unique_ptr<Optimizer> inner, LossScaleOptions options)
    : Optimizer(checked_inner_lr(inner)), inner_(std::move(inner)), options_(std::move(options)) {
  if (inner_->scales_loss()) {
    MIXTRAIN_FAIL(kInvalidInput, "LossScaleOptimizer: the inner optimizer is already a LossScaleOptimizer",
                  "wrap the plain optimizer once; two wrappers would scale the loss twice");
  }
  const LossScaleOptions& o = options_;
  MIXTRAIN_CHECK(std::isfinite(o.initial_scale) && o.initial_scale > 0.0f,
                 "LossScaleOptimizer: initial_scale must be finite and > 0, got " << o.initial_scale);
  if (o.dynamic) {
    MIXTRAIN_CHECK(std::isfinite(o.min_scale) && o.min_scale > 0.0f,
                   "LossScaleOptimizer: min_scale must be finite and > 0, got " << o.min_scale);
    MIXTRAIN_CHECK(std::isfinite(o.max_scale) && o.max_scale >= o.min_scale,
                   "LossScaleOptimizer: max_scale must be finite and >= min_scale, got " << o.max_scale);
    MIXTRAIN_CHECK(o.initial_scale >= o.min_scale && o.initial_scale <= o.max_scale,
                   "LossScaleOptimizer: initial_scale " << o.initial_scale << " is outside [min_scale "
                                                        << o.min_scale << ", max_scale " << o.max_scale << "]");
  }
  MIXTRAIN_CHECK(o.dynamic_growth_steps >= 1,
                 "LossScaleOptimizer: dynamic_growth_steps must be >= 1, got " << o.dynamic_growth_steps);
  MIXTRAIN_CHECK(o.hysteresis >= 1, "LossScaleOptimizer: hysteresis must be >= 1, got " << o.hysteresis);
  MIXTRAIN_CHECK(o.floor_alarm_steps >= 0,
                 "LossScaleOptimizer: floor_alarm_steps must be >= 0 (0 disables), got " << o.floor_alarm_steps);
  scale_state_ = Tensor::from_floats({2}, {o.initial_scale, o.initial_scale});
  counters_ = Tensor::zeros({kNumCounters}, DType::kInt32);
  counter_ref(kHysteresisLeft) = o.hysteresis;
  counter_ref(kAllFinite) = 1;
  found_inf_ = Tensor::zeros({1}, DType::kFloat32);
}

ops::LossScaleRule LossScaleOptimizer::rule() const {
  ops::LossScaleRule r;
  r.dynamic = options_.dynamic;
  r.growth_steps = options_.dynamic_growth_steps;
  r.min_scale = options_.min_scale;
  r.max_scale = options_.max_scale;
  r.hysteresis = options_.hysteresis;
  r.floor_alarm_steps = options_.floor_alarm_steps;
  return r;
}

void LossScaleOptimizer::place_state(const Device& device) const {
  if (scale_state_.device() == device) return;
  scale_state_ = ops::to_device(scale_state_, device);
  counters_ = ops::to_device(counters_, device);
  found_inf_ = ops::to_device(found_inf_, device);
}

Tensor LossScaleOptimizer::host_scale_state() const { return ops::to_device(scale_state_, Device::cpu()); }
Tensor LossScaleOptimizer::host_counters() const { return ops::to_device(counters_, Device::cpu()); }

float LossScaleOptimizer::loss_scale() const { return host_scale_state().data<float>()[0]; }
float LossScaleOptimizer::min_scale_seen() const { return host_scale_state().data<float>()[1]; }
int64_t LossScaleOptimizer::counter(Counter c) const { return host_counters().data<int32_t>()[c]; }
int32_t& LossScaleOptimizer::counter_ref(Counter c) {
  place_state(Device::cpu());
  return counters_.data<int32_t>()[c];
}
float* LossScaleOptimizer::scale_ref() {
  place_state(Device::cpu());
  return scale_state_.data<float>();
}

std::optional<LossScaleReport> LossScaleOptimizer::loss_scale_report() const {
  tell_alarms();
  LossScaleReport r;
  r.scale = loss_scale();
  r.min_scale_seen = min_scale_seen();
  r.skipped_steps = skipped_steps();
  r.good_steps_in_a_row = good_steps_in_a_row();
  r.last_step_skipped = last_step_skipped();
  r.stuck_at_floor = stuck_at_floor();
  return r;
}

Tensor LossScaleOptimizer::scale_loss(const Tensor& loss) const {
  MIXTRAIN_CHECK(loss.defined() && is_float(loss.dtype()),
                 "scale_loss: the loss must be a floating-point tensor, got "
                     << (loss.defined() ? loss.describe() : std::string("an undefined tensor")));
  place_state(loss.device());
  return ops::apply_loss_scale(loss, scale_state_);  // S read where the state lives: no host round trip
}

void LossScaleOptimizer::check_pairs(const std::vector<Tensor>& grads, const std::vector<Var>& vars) const {
  MIXTRAIN_CHECK(grads.size() == vars.size(),
                 "LossScaleOptimizer.apply: " << grads.size() << " gradients for " << vars.size() << " variables");
  for (size_t i = 0; i < grads.size(); ++i) {
    MIXTRAIN_CHECK(vars[i].defined(), "LossScaleOptimizer.apply: variable " << i << " is undefined");
    if (!grads[i].defined()) continue;
    // Checked here as well as in the inner optimizer, because a skipped step never reaches the inner check.
    if (!is_float(grads[i].dtype()) || grads[i].shape() != vars[i].shape()) {
      MIXTRAIN_FAIL(kInvalidInput,
                    "LossScaleOptimizer.apply: gradient " << grads[i].describe() << " does not match variable '"
                                                          << vars[i].name() << "' " << vars[i].value().describe(),
                    "pass one floating-point gradient per variable, with the variable's shape");
    }
  }
}

std::vector<Tensor> LossScaleOptimizer::unscale(const std::vector<Tensor>& scaled, bool stop_early,
                                                bool* all_finite) const {
  // The pass of apply_arena(), one tensor at a time with a flag of its own (this path decides on the host).
  std::vector<Tensor> out(scaled.size());
  Device device = Device::cpu();
  for (const Tensor& g : scaled)
    if (g.defined()) device = g.device();
  place_state(device);
  Tensor found_inf = ops::full({1}, DType::kFloat32, 0.0f, device);
  for (size_t i = 0; i < scaled.size(); ++i) {
    const Tensor& g = scaled[i];
    if (!g.defined()) continue;
    MIXTRAIN_CHECK(is_float(g.dtype()), "LossScaleOptimizer: gradient " << g.describe() << " is not floating-point");
    out[i] = Tensor::empty(g.shape(), DType::kFloat32, g.device());
    ops::unscale_and_check(g, scale_state_, found_inf, out[i]);
    if (stop_early && ops::read_scalar(found_inf) != 0.0f) break;
  }
  if (all_finite != nullptr) *all_finite = ops::read_scalar(found_inf) == 0.0f;
  return out;
}

Var LossScaleOptimizer::scale_loss(const Var& loss) const {
  MIXTRAIN_CHECK(loss.defined() && is_float(loss.dtype()),
                 "scale_loss: the loss must be a floating-point value, got "
                     << (loss.defined() ? loss.value().describe() : std::string("an undefined Var")));
  // float32 first, so a float16 loss times 2^15 cannot overflow.
  return scale(cast(loss, DType::kFloat32), loss_scale());
}

std::vector<Tensor> LossScaleOptimizer::get_unscaled_gradients(const std::vector<Tensor>& scaled,
                                                               bool* all_finite) const {
  return unscale(scaled, /*stop_early=*/false, all_finite);
}

void LossScaleOptimizer::apply(const std::vector<Tensor>& grads, const std::vector<Var>& vars) {
  check_has_variables(vars);
  check_pairs(grads, vars);
  bool finite = true;
  std::vector<Tensor> unscaled = unscale(grads, /*stop_early=*/true, &finite);
  finish_step(finite, [&] { inner_->apply(unscaled, vars); });
}

void LossScaleOptimizer::apply_unscaled(const std::vector<Tensor>& grads, const std::vector<Var>& vars,
                                        bool all_finite) {
  check_has_variables(vars);
  check_pairs(grads, vars);
  finish_step(all_finite, [&] { inner_->apply(grads, vars); });
}

void LossScaleOptimizer::apply_arena(ParameterArena& arena) {
  check_has_variables(arena.vars());
  if (!arena.bound_to(arena.vars())) {
    MIXTRAIN_FAIL(kInvalidInput,
                  "LossScaleOptimizer.apply_arena: the arena's variables were replaced or changed dtype since bind()",
                  "call arena.bind(vars) again after changing a dtype policy");
  }
  // Three ops on the state tensors, nothing read back: unscale and raise the flag, the fused update that skips on
  // it, the scale rule that reads it.
  place_state(arena.device());
  ops::fill(found_inf_, 0.0f);
  const std::vector<DType> dtypes = arena.dtypes();
  std::vector<Tensor> unscaled(dtypes.size());
  for (size_t g = 0; g < dtypes.size(); ++g) {
    Tensor scaled = arena.gradient_buffer_for_update(dtypes[g]);  // (capacity,), unscaled in place
    if (dtypes[g] == DType::kFloat32) {
      ops::unscale_and_check(scaled, scale_state_, found_inf_);
      unscaled[g] = scaled;
    } else {
      // Unscaled 16-bit gradients would underflow: they go to float32, as apply() unscales them.
      unscaled[g] = Tensor::empty({scaled.numel()}, DType::kFloat32, scaled.device());
      ops::unscale_and_check(scaled, scale_state_, found_inf_, unscaled[g]);
    }
  }
  inner_->apply_flat_gradients(arena, unscaled, {&found_inf_, options_.skipped_steps_advance_iterations});
  ops::update_loss_scale(scale_state_, counters_, found_inf_, rule());
  if (counters_.device().type == DeviceType::kCpu) tell_alarms();  // in host memory: no transfer
}

void LossScaleOptimizer::restart_loss_scale() {
  scale_ref()[0] = options_.initial_scale;
  counter_ref(kGrowth) = 0;
  counter_ref(kHysteresisLeft) = options_.hysteresis;
  counter_ref(kFloorSkips) = 0;
  counter_ref(kStuck) = 0;
}

void LossScaleOptimizer::finish_step(bool all_finite, const std::function<void()>& apply_inner) {
  // The inner optimizer validates and may throw; bookkeeping follows only a successful update. A skipped step
  // reaches nothing of the inner optimizer, so variables and slots stay bit-identical.
  if (all_finite) apply_inner();
  if (!all_finite && options_.skipped_steps_advance_iterations) inner_->set_iterations(inner_->iterations() + 1);
  ops::fill(found_inf_, all_finite ? 0.0f : 1.0f);
  ops::update_loss_scale(scale_state_, counters_, found_inf_, rule());
  tell_alarms();
}

void LossScaleOptimizer::tell_alarms() const {
  const int64_t raised = counter(kAlarms);
  if (raised <= alarms_told_) return;
  alarms_told_ = raised;
  std::ostringstream msg;
  msg << "LossScaleOptimizer: " << options_.floor_alarm_steps << " consecutive steps skipped with the loss scale at "
      << (options_.dynamic ? "its minimum " : "its fixed value ") << loss_scale()
      << ". The gradients are inf/NaN even at this scale, so lowering it cannot help: the inf/NaN most likely "
         "comes from the forward pass, the loss or the data, not from float16 gradient overflow. Training is not "
         "progressing. Check the inputs and the loss for inf/NaN, keep softmax, normalization and the loss in "
         "float32, or use the mixed_bfloat16 or float32 policy.";
  if (options_.on_event)
    options_.on_event(msg.str());
  else
    std::cerr << "warning: " << msg.str() << "\n";  // never silent: a run that stopped updating must be seen
}

void LossScaleOptimizer::update(float*, const float*, int64_t, const std::string&) {
  MIXTRAIN_FAIL(kInternal, "LossScaleOptimizer::update is not used; apply() forwards to the inner optimizer", "");
}

NamedTensors LossScaleOptimizer::state() const {
  NamedTensors out = inner_->state();
  for (const auto& [k, t] : out) {
    if (k.rfind(kPrefix, 0) == 0) {
      MIXTRAIN_FAIL(kInvalidInput, "LossScaleOptimizer: inner state entry '" << k << "' collides with its own keys",
                    "rename the variable so its name does not start with 'loss_scale/'");
    }
  }
  out.emplace_back("loss_scale/scale", Tensor::from_floats({1}, {loss_scale()}));
  out.emplace_back("loss_scale/counter", int_entry(counter(kGrowth)));
  out.emplace_back("loss_scale/hysteresis_left", int_entry(counter(kHysteresisLeft)));
  out.emplace_back("loss_scale/skipped_steps", int_entry(skipped_steps()));
  out.emplace_back("loss_scale/good_steps_in_a_row", int_entry(good_steps_in_a_row()));
  out.emplace_back("loss_scale/floor_skips", int_entry(counter(kFloorSkips)));
  out.emplace_back("loss_scale/last_step_skipped", int_entry(last_step_skipped() ? 1 : 0));
  out.emplace_back("loss_scale/stuck_at_floor", int_entry(stuck_at_floor() ? 1 : 0));
  out.emplace_back("loss_scale/min_scale_seen", Tensor::from_floats({1}, {min_scale_seen()}));
  return out;
}

void LossScaleOptimizer::load_state(const NamedTensors& state) {
  NamedTensors inner_state;
  std::map<std::string, Tensor> own;
  for (const auto& [k, t] : state) {
    if (k.rfind(kPrefix, 0) == 0) {
      own[k.substr(std::string(kPrefix).size())] = t;
    } else {
      inner_state.emplace_back(k, t);
    }
  }
  // Takes the one-element entry `key` of `dtype` out of `own`; nullopt when absent and not required.
  auto take = [&](const std::string& key, bool required, DType dtype) -> std::optional<Tensor> {
    auto it = own.find(key);
    if (it == own.end()) {
      if (required) {
        MIXTRAIN_FAIL(kInvalidInput, "LossScaleOptimizer.load_state: missing '" << kPrefix << key << "'",
                      "pass the output of LossScaleOptimizer::state()");
      }
      return std::nullopt;
    }
    const Tensor& t = it->second;
    MIXTRAIN_CHECK(t.defined() && t.dtype() == dtype && t.numel() == 1,
                   "LossScaleOptimizer.load_state: '" << kPrefix << key << "' must be one " << dtype_name(dtype));
    const Tensor v = t;
    own.erase(it);
    return v;
  };
  auto get_float = [&](const std::string& key, bool required, float fallback) {
    const std::optional<Tensor> t = take(key, required, DType::kFloat32);
    return t ? t->at(0) : fallback;
  };
  auto get_int = [&](const std::string& key, bool required, int64_t fallback) -> int64_t {
    const std::optional<Tensor> t = take(key, required, DType::kInt32);
    if (!t) return fallback;
    const int64_t v = t->to_ints()[0];  // exact: no float round trip
    MIXTRAIN_CHECK(v >= 0, "LossScaleOptimizer.load_state: '" << kPrefix << key << "' is negative (" << v << ")");
    return v;
  };
  const float scale = get_float("scale", true, 0.0f);
  MIXTRAIN_CHECK(std::isfinite(scale) && scale > 0.0f,
                 "LossScaleOptimizer.load_state: the saved scale " << scale << " is not finite and positive");
  const int64_t growth = get_int("counter", true, 0);
  const int64_t hysteresis_left = get_int("hysteresis_left", false, options_.hysteresis);
  const int64_t skipped = get_int("skipped_steps", false, 0);
  const int64_t good = get_int("good_steps_in_a_row", false, 0);
  const int64_t floor_skips = get_int("floor_skips", false, 0);
  const bool last_skipped = get_int("last_step_skipped", false, 0) != 0;
  const bool stuck = get_int("stuck_at_floor", false, 0) != 0;
  const float min_seen = get_float("min_scale_seen", false, scale);
  if (!own.empty()) {
    MIXTRAIN_FAIL(kInvalidInput, "LossScaleOptimizer.load_state: unknown entry '" << kPrefix << own.begin()->first
                                                                                   << "'",
                  "pass the output of LossScaleOptimizer::state()");
  }
  inner_->load_state(inner_state);  // validates the rest; throws before anything of ours changes
  float* f = scale_ref();
  f[0] = scale;
  f[1] = min_seen;
  auto put = [this](Counter c, int64_t v) {
    counter_ref(c) = static_cast<int32_t>(std::min<int64_t>(v, std::numeric_limits<int32_t>::max()));
  };
  put(kGrowth, growth);
  put(kHysteresisLeft, hysteresis_left);
  put(kSkipped, skipped);
  put(kGood, good);
  put(kFloorSkips, floor_skips);
  put(kLastSkipped, last_skipped ? 1 : 0);
  put(kStuck, stuck ? 1 : 0);
  put(kAllFinite, last_skipped ? 0 : 1);
  put(kAlarms, 0);
  alarms_told_ = 0;
  ops::fill(found_inf_, last_skipped ? 1.0f : 0.0f);
}

}  // namespace mixtrain
