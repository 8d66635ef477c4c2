#include "mixtrain/precision/optimizer_config.h"

#include <charconv>
#include <string>
#include <system_error>

#include "mixtrain/optim/adam.h"
#include "mixtrain/optim/rmsprop.h"
#include "mixtrain/optim/sgd.h"
#include "mixtrain/precision/loss_scale_optimizer.h"

namespace mixtrain {

namespace {

float float_at(const Json& c, const char* key) { return static_cast<float>(c.at(key).as_number()); }

Json loss_scale_json(const LossScaleOptions& o) {
  return Json::object({{"initial_scale", o.initial_scale},
                       {"dynamic_growth_steps", o.dynamic_growth_steps},
                       {"dynamic", o.dynamic},
                       {"min_scale", o.min_scale},
                       {"max_scale", o.max_scale},
                       {"hysteresis", o.hysteresis},
                       {"floor_alarm_steps", o.floor_alarm_steps},
                       {"skipped_steps_advance_iterations", o.skipped_steps_advance_iterations}});
}

LossScaleOptions loss_scale_from(const Json& c) {
  LossScaleOptions o;
  o.initial_scale = float_at(c, "initial_scale");
  o.dynamic_growth_steps = c.at("dynamic_growth_steps").as_int64();
  o.dynamic = c.at("dynamic").as_bool();
  o.min_scale = float_at(c, "min_scale");
  o.max_scale = float_at(c, "max_scale");
  o.hysteresis = static_cast<int>(c.at("hysteresis").as_int64());
  o.floor_alarm_steps = c.at("floor_alarm_steps").as_int64();
  o.skipped_steps_advance_iterations = c.at("skipped_steps_advance_iterations").as_bool();
  return o;
}

// The update rule's own hyperparameters.
void add_rule(Json& c, const Optimizer& opt) {
  if (const auto* adam = dynamic_cast<const Adam*>(&opt)) {
    c["beta_1"] = adam->options().beta1;
    c["beta_2"] = adam->options().beta2;
    c["epsilon"] = adam->options().epsilon;
    // Only when on, so files of float32 master weights read as before. The seed as a decimal string: a 64-bit
    // integer does not fit a JSON number exactly.
    if (adam->options().stochastic_rounding) c["rounding_seed"] = std::to_string(adam->options().rounding_seed);
    if (adam->options().kahan_summation) c["kahan_summation"] = true;
    // Likewise only when not float32.
    if (adam->options().optimizer_state != DType::kFloat32)
      c["optimizer_state"] = dtype_name(adam->options().optimizer_state);
  }
  if (const auto* adamw = dynamic_cast<const AdamW*>(&opt)) {
    c["weight_decay"] = adamw->weight_decay();
    Json exclude = Json::array();
    for (const std::string& s : adamw->exclude_from_weight_decay()) exclude.push_back(s);
    c["exclude_from_weight_decay"] = exclude;
  }
  if (const auto* sgd = dynamic_cast<const Sgd*>(&opt)) {
    c["momentum"] = sgd->momentum();
    c["nesterov"] = sgd->nesterov();
  }
  if (const auto* rms = dynamic_cast<const RMSprop*>(&opt)) {
    c["rho"] = rms->options().rho;
    c["momentum"] = rms->options().momentum;
    c["epsilon"] = rms->options().epsilon;
    c["centered"] = rms->options().centered;
  }
}

// Adam's "rounding_seed": a decimal string of a 64-bit unsigned integer.
uint64_t seed_from(const Json& j) {
  const std::string& s = j.as_string();
  uint64_t seed = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), seed);
  MIXTRAIN_CHECK(ec == std::errc() && end == s.data() + s.size() && !s.empty(),
                 "optimizer config: rounding_seed '" << s << "' is not a 64-bit unsigned decimal integer");
  return seed;
}

std::unique_ptr<Optimizer> rule_from(const Json& c) {
  const std::string& name = c.at("class_name").as_string();
  const float lr = float_at(c, "learning_rate");
  if (name == "adam" || name == "adamw") {
    AdamOptions o{c.at("beta_1").as_number(), c.at("beta_2").as_number(), float_at(c, "epsilon")};
    if (const Json* seed = c.find("rounding_seed")) {
      o.stochastic_rounding = true;
      o.rounding_seed = seed_from(*seed);
    }
    if (const Json* kahan = c.find("kahan_summation")) o.kahan_summation = kahan->as_bool();
    if (const Json* state = c.find("optimizer_state")) {
      MIXTRAIN_CHECK(state->as_string() == "bfloat16" || state->as_string() == "float32",
                     "optimizer config: optimizer_state '" << state->as_string() << "' is not float32 or bfloat16");
      o.optimizer_state = state->as_string() == "bfloat16" ? DType::kBFloat16 : DType::kFloat32;
    }
    if (name == "adam") return std::make_unique<Adam>(lr, o);
    std::vector<std::string> exclude;
    for (const Json& s : c.at("exclude_from_weight_decay").as_array()) exclude.push_back(s.as_string());
    return std::make_unique<AdamW>(lr, float_at(c, "weight_decay"), o, std::move(exclude));
  }
  if (name == "sgd") return std::make_unique<Sgd>(lr, float_at(c, "momentum"), c.at("nesterov").as_bool());
  if (name == "rmsprop") {
    RMSpropOptions o{c.at("rho").as_number(), c.at("momentum").as_number(), float_at(c, "epsilon"),
                     c.at("centered").as_bool()};
    return std::make_unique<RMSprop>(lr, o);
  }
  MIXTRAIN_FAIL(kInvalidInput, "optimizer configuration: unknown class_name '" << name << "'",
                "valid optimizers: sgd, adam, adamw, rmsprop");
}

}  // namespace

Json optimizer_config(const Optimizer& optimizer) {
  const Optimizer& inner = optimizer.inner_optimizer();
  const std::string name = inner.name();
  const bool known = (name == "adam" && typeid(inner) == typeid(Adam)) ||
                     (name == "adamw" && typeid(inner) == typeid(AdamW)) ||
                     (name == "sgd" && typeid(inner) == typeid(Sgd)) ||
                     (name == "rmsprop" && typeid(inner) == typeid(RMSprop));
  MIXTRAIN_CHECK(known, "optimizer_config: the optimizer '" << name << "' is not SGD, Adam, AdamW or RMSprop, whose "
                        "configuration can be saved; save the weights (save_weights) or a checkpoint instead");
  if (const auto schedule = inner.learning_rate_schedule()) {
    MIXTRAIN_FAIL(kInvalidInput,
                  "optimizer_config: the learning-rate schedule " << schedule->describe() << " cannot be saved yet",
                  "save a checkpoint (save_checkpoint) and set the schedule again in the code that loads it");
  }
  Json c = Json::object({{"class_name", name}, {"learning_rate", inner.learning_rate()}});
  add_rule(c, inner);
  const std::optional<float> clip = inner.global_clipnorm();
  c["global_clipnorm"] = clip ? Json(*clip) : Json();
  c["gradient_accumulation_steps"] = inner.gradient_accumulation_steps();
  const auto* scaler = dynamic_cast<const LossScaleOptimizer*>(&optimizer);
  c["loss_scale"] = scaler ? loss_scale_json(scaler->options()) : Json();
  return c;
}

std::unique_ptr<Optimizer> optimizer_from_config(const Json& config) {
  try {
    std::unique_ptr<Optimizer> opt = rule_from(config);
    const Json& clip = config.at("global_clipnorm");
    if (!clip.is_null()) opt->set_global_clipnorm(static_cast<float>(clip.as_number()));
    opt->set_gradient_accumulation_steps(config.at("gradient_accumulation_steps").as_int64());
    const Json& scale = config.at("loss_scale");
    if (!scale.is_null()) opt = std::make_unique<LossScaleOptimizer>(std::move(opt), loss_scale_from(scale));
    return opt;
  } catch (const Error& e) {
    MIXTRAIN_FAIL(kInvalidInput, "optimizer configuration " << config.dump() << ": " << e.message(), e.hint());
  }
}

}  // namespace mixtrain
