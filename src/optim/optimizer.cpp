#include "mixtrain/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "mixtrain/ops/transfer.h"

namespace mixtrain {

namespace {

bool has_slot_prefix(const std::string& key, std::string* var, std::string* slot) {
  const auto pos = key.rfind('/');
  if (pos == std::string::npos || pos == 0 || pos + 1 == key.size()) return false;
  *var = key.substr(0, pos);
  *slot = key.substr(pos + 1);
  return true;
}

Tensor scalar_int(int64_t value) {
  MIXTRAIN_CHECK(value >= 0 && value <= std::numeric_limits<int32_t>::max(),
                 "optimizer counter " << value << " does not fit the int32 checkpoint entry");
  return Tensor::from_ints({1}, {static_cast<int32_t>(value)});
}

}  // namespace

Optimizer::Optimizer(float learning_rate) { set_learning_rate(learning_rate); }

Optimizer::~Optimizer() = default;

float Optimizer::learning_rate() const {
  if (step_rate_) return *step_rate_;
  if (schedule_) return scheduled_rate_at(settled_iterations());
  return learning_rate_;
}

float Optimizer::scheduled_rate_at(int64_t iterations) const {
  const float lr = (*schedule_)(iterations);
  if (!(std::isfinite(lr) && lr >= 0.0f)) {
    MIXTRAIN_FAIL(kInvalidInput,
                  name() << ": the learning-rate schedule " << schedule_->describe() << " gives " << lr << " at step "
                         << iterations,
                  "a learning rate must be finite and >= 0; check the schedule's arguments");
  }
  return lr;
}

void Optimizer::set_learning_rate(float learning_rate) {
  if (schedule_) {
    MIXTRAIN_FAIL(kInvalidInput,
                  name() << ": the learning rate follows the schedule " << schedule_->describe()
                         << " and cannot be set to " << learning_rate,
                  "remove the schedule first (set_learning_rate_schedule(nullptr)), or do not combine a schedule "
                  "with callbacks that set the rate (Keras refuses this too)");
  }
  MIXTRAIN_CHECK(std::isfinite(learning_rate) && learning_rate >= 0.0f,
                 "learning rate must be finite and >= 0, got " << learning_rate);
  learning_rate_ = learning_rate;
}

void Optimizer::set_learning_rate_schedule(std::shared_ptr<const LearningRateSchedule> schedule) {
  if (!schedule) {
    // Removing a schedule keeps the rate where it stood, so the next update continues from it.
    if (schedule_) learning_rate_ = scheduled_rate_at(settled_iterations());
    schedule_ = nullptr;
    return;
  }
  // A schedule that gives no valid rate at the current step fails here, not in the middle of a run.
  std::shared_ptr<const LearningRateSchedule> previous = std::exchange(schedule_, std::move(schedule));
  try {
    (void)scheduled_rate_at(settled_iterations());
  } catch (...) {
    schedule_ = std::move(previous);
    throw;
  }
}

void Optimizer::set_iterations(int64_t iterations) {
  MIXTRAIN_CHECK(iterations >= 0, "iterations must be >= 0, got " << iterations);
  iterations_ = iterations;
  drop_device_counter();
}

int64_t Optimizer::settled_iterations() const {
  DeviceIterations& d = device_iterations_;
  if (d.uncertain > 0) {
    // The one read-back of the device path: the count after the steps whose skip the host did not see.
    iterations_ = ops::to_device(d.counter, Device::cpu()).data<int64_t>()[0];
    d.uncertain = 0;
    ++d.generation;
    d.last_uncertain.reset();
  }
  return iterations_;
}

void Optimizer::resolve_uncertain_update(uint64_t ticket, bool advanced) {
  DeviceIterations& d = device_iterations_;
  if (ticket != d.generation || d.uncertain == 0) return;  // accounted for when the counter was read or dropped
  // The device's counter lies in [iterations_, iterations_ + uncertain]; this update's share is now known.
  if (advanced) ++iterations_;
  --d.uncertain;
}

void Optimizer::set_global_clipnorm(std::optional<float> clip_norm) {
  MIXTRAIN_CHECK(!clip_norm || (std::isfinite(*clip_norm) && *clip_norm > 0.0f),
                 "global_clipnorm must be finite and > 0, got " << *clip_norm);
  global_clipnorm_ = clip_norm;
}

void Optimizer::set_gradient_accumulation_steps(int64_t steps) {
  MIXTRAIN_CHECK(steps >= 1, "gradient_accumulation_steps must be >= 1 (1: no accumulation), got " << steps);
  accumulation_steps_ = steps;
}

std::string Optimizer::var_key(const Var& var, size_t index) {
  return var.name().empty() ? "var_" + std::to_string(index) : var.name();
}

void Optimizer::check_has_variables(const std::vector<Var>& vars) const {
  if (vars.empty()) {
    MIXTRAIN_FAIL(kInvalidInput, name() << ".apply: no variables to update, so nothing would train",
                  "a model has no weights until it is built: call model.build_for(sample_shape) (or run it once) "
                  "before taking model.trainable_weights()");
  }
}

std::vector<std::string> Optimizer::checked_keys(const std::vector<Tensor>& grads, const std::vector<Var>& vars) const {
  std::vector<std::string> keys(vars.size());
  std::set<std::string> seen;
  for (size_t i = 0; i < vars.size(); ++i) {
    const Var& v = vars[i];
    MIXTRAIN_CHECK(v.defined(), name() << ".apply: variable " << i << " is undefined");
    keys[i] = var_key(v, i);
    if (!grads[i].defined()) continue;
    if (!v.value().device().is_cpu() || !grads[i].device().is_cpu()) {
      MIXTRAIN_FAIL(kInvalidInput,
                    name() << ".apply: variable '" << keys[i] << "' " << v.value().describe() << " with gradient "
                           << grads[i].describe() << ": the update variable by variable runs on the CPU",
                    "bind the variables to a ParameterArena on their device and call apply_arena()");
    }
    if (!is_float(v.dtype())) {
      MIXTRAIN_FAIL(kInvalidInput,
                    name() << ".apply: variable '" << keys[i] << "' is " << v.value().describe()
                           << "; optimizers update floating variables",
                    "create variables in the policy's variable_dtype");
    }
    if (!v.trainable()) {
      MIXTRAIN_FAIL(kInvalidInput, name() << ".apply: variable '" << keys[i] << "' is not trainable",
                    "pass only trainable variables to the optimizer");
    }
    if (grads[i].dtype() != DType::kFloat32 || grads[i].shape() != v.shape()) {
      MIXTRAIN_FAIL(kInvalidInput,
                    name() << ".apply: gradient " << grads[i].describe() << " does not match variable '" << keys[i]
                           << "' " << v.value().describe(),
                    "gradients must be float32 with the variable's shape; unscale and convert low-precision "
                    "gradients first (LossScaleOptimizer does this)");
    }
    if (!seen.insert(keys[i]).second) {
      MIXTRAIN_FAIL(kInvalidInput, name() << ".apply: two variables share the name '" << keys[i] << "'",
                    "give each variable a unique name; optimizer state is keyed by name");
    }
    for (const std::string& s : slot_names()) {
      auto it = slots_.find(keys[i] + "/" + s);
      // A restored slot whose size differs belongs to another model: refuse rather than read out of bounds.
      if (it != slots_.end() && it->second.numel() != v.value().numel()) {
        MIXTRAIN_FAIL(kInvalidInput,
                      name() << ": slot '" << it->first << "' " << it->second.describe() << " does not match variable "
                             << v.value().describe(),
                      "the loaded optimizer state comes from a different model");
      }
    }
  }
  return keys;
}

void Optimizer::refuse_stochastic_rounding(const std::vector<Var>& vars) const {
  const std::optional<ops::UpdateConstants> rule = fused_rule();
  if (!rule || !rule->stochastic_rounding) return;
  for (const Var& v : vars) {
    MIXTRAIN_CHECK(v.dtype() != DType::kBFloat16,
                   name() << ".apply: the bfloat16 variable '" << v.name()
                          << "' would round to nearest; stochastic rounding draws by the element's offset in a "
                             "parameter arena, so update it with apply_arena()");
  }
}

bool Optimizer::keeps_slot(const std::string& slot) const {
  const std::vector<std::string> names = slot_names();
  return std::find(names.begin(), names.end(), slot) != names.end();
}

void Optimizer::check_kahan_slots(const std::map<std::string, Tensor>& slots) const {
  if (!keeps_slot("kahan")) return;
  for (const auto& [key, t] : slots) {
    if (key.size() < 2 || key.compare(key.size() - 2, 2, "/m") != 0) continue;
    const std::string compensation = key.substr(0, key.size() - 2) + "/kahan";
    if (slots.count(compensation) == 0) {
      MIXTRAIN_FAIL(kInvalidInput,
                    name() << ".load_state: the state has no Kahan compensation ('" << compensation
                           << "') but this optimizer keeps one",
                    "resume with the --master-rounding the state was saved with (nearest or stochastic)");
    }
  }
}

void Optimizer::refuse_16bit_state() const {
  if (keeps_slot("kahan")) {
    MIXTRAIN_FAIL(kInvalidInput,
                  name() << ".apply: Kahan compensation lives in the arena's flat buffers, which the update variable "
                            "by variable does not keep",
                  "bind the variables to a ParameterArena and call apply_arena() (what fit() runs)");
  }
  if (state_dtype() == DType::kFloat32) return;
  MIXTRAIN_FAIL(kInvalidInput,
                name() << ".apply: the optimizer state is " << dtype_name(state_dtype())
                       << ", which the update variable by variable does not keep (it reads float32 slots)",
                "bind the variables to a ParameterArena and call apply_arena() (what fit() runs)");
}

void Optimizer::apply(const std::vector<Tensor>& grads, const std::vector<Var>& vars) {
  check_has_variables(vars);
  MIXTRAIN_CHECK(grads.size() == vars.size(),
                 name() << ".apply: " << grads.size() << " gradients for " << vars.size() << " variables");
  const StepRatePin rate(*this);  // one scheduled rate for the whole update, checked before anything changes
  // Validate everything first so a bad call leaves variables and state untouched.
  const std::vector<std::string> keys = checked_keys(grads, vars);
  refuse_stochastic_rounding(vars);
  refuse_16bit_state();
  if (shard_) {
    MIXTRAIN_FAIL(kInvalidInput, name() << ".apply: a sharded optimizer (ZeRO-1) keeps slots in the arena's layout",
                  "bind the variables to a ParameterArena and call apply_arena() (what fit() runs)");
  }
  // Slots have the variable's shape, so checkpoints read naturally; restored ones are reshaped on first use.
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!grads[i].defined()) continue;
    for (const std::string& s : slot_names()) {
      Tensor& t = slots_[keys[i] + "/" + s];
      if (!t.defined()) {
        t = Tensor::zeros(vars[i].shape(), DType::kFloat32);
        ++slots_generation_;
      } else if (t.shape() != vars[i].shape()) {
        t = t.reshape(vars[i].shape());
      }
    }
  }
  std::vector<Tensor> g = grads;
  if (global_clipnorm_) clip_by_global_norm(g, *global_clipnorm_);
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!g[i].defined()) continue;
    Var v = vars[i];
    if (v.dtype() == DType::kFloat32) {
      update(v.mutable_value().data<float>(), g[i].data<float>(), v.value().numel(), keys[i]);
    } else {
      // A float16 / bfloat16 variable (the pure "float16" / "bfloat16" policies): the update runs in float32
      // with float32 state, and the result is rounded once into the variable's dtype.
      Tensor wide = v.value().to(DType::kFloat32);
      update(wide.data<float>(), g[i].data<float>(), wide.numel(), keys[i]);
      convert_elements(wide.raw(), DType::kFloat32, v.mutable_value().raw(), v.dtype(), wide.numel());
    }
    v.bump_version();
  }
  iterations_ = settled_iterations() + 1;
  drop_device_counter();
}

void Optimizer::update(float* value, const float* grad, int64_t n, const std::string& var_key) {
  const std::vector<std::string> names = slot_names();
  std::vector<float*> slots;
  slots.reserve(names.size());
  for (const std::string& s : names) slots.push_back(slot(var_key, s));
  update_span(value, grad, slots.data(), n, update_class(var_key));
}

void Optimizer::update_span(float*, const float*, float* const*, int64_t, int) {
  MIXTRAIN_FAIL(kInternal, name() << " has no update_span()", "override update() or update_span()");
}

int Optimizer::update_class(const std::string&) const { return 0; }

float* Optimizer::slot(const std::string& var_key, const std::string& slot) {
  auto it = slots_.find(var_key + "/" + slot);
  if (it == slots_.end()) {
    MIXTRAIN_FAIL(kInternal, name() << ": slot '" << var_key << "/" << slot << "' was not created",
                  "slot_names() must list every slot update() reads");
  }
  return it->second.data<float>();
}

NamedTensors Optimizer::state() const {
  check_state_gathered();
  NamedTensors out;
  out.emplace_back("iterations", scalar_int(settled_iterations()));
  out.emplace_back("learning_rate", Tensor::from_floats({1}, {learning_rate()}));
  // Slots of an arena on a device come back to the host: a checkpoint is host memory.
  for (const auto& [k, t] : slots_)
    out.emplace_back(k, t.device().is_cpu() ? t.clone() : ops::to_device(t, Device::cpu()));
  return out;
}

void Optimizer::load_state(const NamedTensors& state) {
  const std::vector<std::string> known = slot_names();
  std::optional<int64_t> iterations;
  std::optional<float> lr;
  std::map<std::string, Tensor> slots;
  for (const auto& [key, t] : state) {
    MIXTRAIN_CHECK(t.defined(), name() << ".load_state: entry '" << key << "' is undefined");
    if (key == "iterations") {
      MIXTRAIN_CHECK(t.dtype() == DType::kInt32 && t.numel() == 1,
                     name() << ".load_state: 'iterations' must be one int32, got " << t.describe());
      iterations = t.to_ints()[0];
      MIXTRAIN_CHECK(*iterations >= 0, name() << ".load_state: negative iterations " << *iterations);
      continue;
    }
    if (key == "learning_rate") {
      MIXTRAIN_CHECK(t.dtype() == DType::kFloat32 && t.numel() == 1,
                     name() << ".load_state: 'learning_rate' must be one float32, got " << t.describe());
      lr = t.at(0);
      continue;
    }
    std::string var, slot_name;
    if (!has_slot_prefix(key, &var, &slot_name) ||
        std::find(known.begin(), known.end(), slot_name) == known.end()) {
      std::string valid;
      for (const auto& s : known) valid += (valid.empty() ? "" : ", ") + s;
      MIXTRAIN_FAIL(kInvalidInput,
                    name() << ".load_state: unknown entry '" << key << "' (expected iterations, learning_rate or "
                           << "<variable>/<slot> with slot one of: " << valid << ")",
                    "the state was saved by a different optimizer");
    }
    if (t.dtype() != slot_dtype(slot_name)) {
      MIXTRAIN_CHECK(slot_name != "kahan", name() << ".load_state: the Kahan compensation '" << key << "' is "
                                                  << t.describe() << ", not bfloat16");
      MIXTRAIN_FAIL(kInvalidInput,
                    name() << ".load_state: slot '" << key << "' is " << t.describe() << ", but this optimizer keeps "
                           << dtype_name(state_dtype()) << " state",
                    std::string("resume with --optimizer-state ") +
                        dtype_name(t.dtype()) + ", the state it was saved with");
    }
    slots[key] = t.clone();
  }
  check_kahan_slots(slots);
  if (!iterations) {
    MIXTRAIN_FAIL(kInvalidInput, name() << ".load_state: no 'iterations' entry",
                  "pass the output of state() from the same kind of optimizer");
  }
  // With a schedule, the restored iterations put it where it was; the stored value was only its reading.
  if (lr && !schedule_) set_learning_rate(*lr);
  iterations_ = *iterations;
  drop_device_counter();
  slots_ = std::move(slots);
  ++slots_generation_;
}

}  // namespace mixtrain
