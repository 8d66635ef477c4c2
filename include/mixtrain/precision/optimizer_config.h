// An optimizer's configuration as JSON, both ways, for whole-model files (train/model_file.h), as Keras'
// optimizer.get_config() / from_config(): the update rule and its hyperparameters, global clipping, gradient
// accumulation, and a LossScaleOptimizer's options around its inner optimizer. State (iterations, slots, the loss
// scale reached) is not configuration: checkpoints carry it (Optimizer::state()).
//
//   {"class_name": "adam", "learning_rate": 0.001, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-07,
//    ("rounding_seed": "42" under stochastic rounding of bfloat16 master weights),
//    ("optimizer_state": "bfloat16" when Adam's moments are bfloat16),
//    "global_clipnorm": null, "gradient_accumulation_steps": 1,
//    "loss_scale": null | {"initial_scale": 32768, "dynamic_growth_steps": 2000, "dynamic": true, ...}}
#pragma once

#include <memory>

#include "mixtrain/core/json.h"
#include "mixtrain/optim/optimizer.h"

namespace mixtrain {

// Error for what cannot be written yet, naming it: a learning-rate schedule, or an optimizer that is not SGD, Adam,
// AdamW or RMSprop (a custom one); a LossScaleOptimizer's on_event callback is not saved.
Json optimizer_config(const Optimizer& optimizer);
// A new optimizer from optimizer_config()'s object; Error naming a missing or invalid entry.
std::unique_ptr<Optimizer> optimizer_from_config(const Json& config);

}  // namespace mixtrain
