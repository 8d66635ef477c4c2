// An optimizer's configuration (precision/optimizer_config.h) rebuilds an optimizer of the same rule and options,
// and what cannot be saved is refused by name.
#include "mixtrain/precision/optimizer_config.h"

#include <gtest/gtest.h>

#include "mixtrain/optim/adam.h"
#include "mixtrain/optim/rmsprop.h"
#include "mixtrain/optim/sgd.h"
#include "mixtrain/precision/loss_scale_optimizer.h"

namespace mixtrain {
namespace {

std::vector<std::unique_ptr<Optimizer>> optimizers() {
  std::vector<std::unique_ptr<Optimizer>> out;
  out.push_back(std::make_unique<Sgd>(0.05f, 0.75f, true));
  out.push_back(std::make_unique<Adam>(0.003f, AdamOptions{0.8, 0.99, 1e-5f}));
  out.push_back(std::make_unique<AdamW>(0.002f, 0.01f, AdamOptions{}, std::vector<std::string>{"bias", "gamma"}));
  out.push_back(std::make_unique<RMSprop>(0.004f, RMSpropOptions{0.8, 0.5, 1e-6f, true}));
  out[1]->set_global_clipnorm(0.5f);
  out[2]->set_gradient_accumulation_steps(3);
  LossScaleOptions o;
  o.initial_scale = 1024.0f;
  o.dynamic_growth_steps = 7;
  o.hysteresis = 2;
  o.skipped_steps_advance_iterations = true;
  out.push_back(std::make_unique<LossScaleOptimizer>(std::make_unique<Adam>(0.01f), o));
  return out;
}

TEST(OptimizerConfig, EveryOptimizerRebuildsWithItsOptions) {
  for (const auto& opt : optimizers()) {
    const Json config = optimizer_config(*opt);
    std::unique_ptr<Optimizer> rebuilt = optimizer_from_config(config);
    EXPECT_EQ(typeid(*rebuilt), typeid(*opt)) << config.dump();
    EXPECT_EQ(optimizer_config(*rebuilt), config) << config.dump();
    EXPECT_EQ(rebuilt->learning_rate(), opt->learning_rate());
    EXPECT_EQ(rebuilt->global_clipnorm(), opt->global_clipnorm());
    EXPECT_EQ(rebuilt->gradient_accumulation_steps(), opt->gradient_accumulation_steps());
  }
  auto scaler = optimizer_from_config(optimizer_config(*optimizers().back()));
  const LossScaleOptions& o = dynamic_cast<LossScaleOptimizer&>(*scaler).options();
  EXPECT_EQ(o.initial_scale, 1024.0f);
  EXPECT_EQ(o.dynamic_growth_steps, 7);
  EXPECT_EQ(o.hysteresis, 2);
  EXPECT_TRUE(o.skipped_steps_advance_iterations);
  EXPECT_EQ(dynamic_cast<const AdamW&>(*optimizer_from_config(optimizer_config(*optimizers()[2])))
                .exclude_from_weight_decay(),
            (std::vector<std::string>{"bias", "gamma"}));
}

TEST(OptimizerConfig, StochasticRoundingKeepsItsSeed) {
  AdamOptions o;
  o.stochastic_rounding = true;
  o.rounding_seed = 0xFEDCBA9876543210ull;  // above 2^53: a JSON number would not hold it
  const AdamW opt(0.002f, 0.01f, o);
  const Json config = optimizer_config(opt);
  std::unique_ptr<Optimizer> rebuilt = optimizer_from_config(config);
  const AdamOptions& r = dynamic_cast<const AdamW&>(*rebuilt).options();
  EXPECT_TRUE(r.stochastic_rounding);
  EXPECT_EQ(r.rounding_seed, o.rounding_seed);
  EXPECT_EQ(optimizer_config(*rebuilt), config);
  // Round to nearest writes nothing new, so older files read as before.
  EXPECT_EQ(optimizer_config(Adam(0.01f)).find("rounding_seed"), nullptr);
  Json bad = config;
  bad["rounding_seed"] = "12x";
  EXPECT_THROW(optimizer_from_config(bad), Error);
}

TEST(OptimizerConfig, Bfloat16StateIsKept) {
  AdamOptions o;
  o.optimizer_state = DType::kBFloat16;
  const Adam opt(0.002f, o);
  const Json config = optimizer_config(opt);
  std::unique_ptr<Optimizer> rebuilt = optimizer_from_config(config);
  EXPECT_EQ(rebuilt->state_dtype(), DType::kBFloat16);
  EXPECT_EQ(optimizer_config(*rebuilt), config);
  // float32 state writes nothing new, so older files read as before.
  EXPECT_EQ(optimizer_config(Adam(0.01f)).find("optimizer_state"), nullptr);
  Json bad = config;
  bad["optimizer_state"] = "float16";
  EXPECT_THROW(optimizer_from_config(bad), Error);
}

TEST(OptimizerConfig, KahanSummationIsKept) {
  AdamOptions o;
  o.kahan_summation = true;
  const AdamW opt(0.002f, 0.01f, o);
  const Json config = optimizer_config(opt);
  std::unique_ptr<Optimizer> rebuilt = optimizer_from_config(config);
  EXPECT_TRUE(dynamic_cast<const AdamW&>(*rebuilt).options().kahan_summation);
  EXPECT_TRUE(rebuilt->keeps_slot("kahan"));
  EXPECT_EQ(optimizer_config(*rebuilt), config);
  // Without it nothing new is written, so older files read as before.
  EXPECT_EQ(optimizer_config(Adam(0.01f)).find("kahan_summation"), nullptr);
}

TEST(OptimizerConfig, SchedulesAndUnknownClassesAreRefused) {
  Adam scheduled;
  scheduled.set_learning_rate_schedule(std::make_shared<ExponentialDecay>(0.1, 100, 0.5));
  try {
    optimizer_config(scheduled);
    FAIL() << "a schedule was written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ExponentialDecay"), std::string::npos) << e.what();
  }
  Json config = optimizer_config(Sgd());
  config["class_name"] = "adagrad";
  EXPECT_THROW(optimizer_from_config(config), Error);
}

}  // namespace
}  // namespace mixtrain
