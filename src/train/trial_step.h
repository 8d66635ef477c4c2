// Trial models and steps, for what is measured before a run rather than estimated: --batch-size auto's search
// (batch_size.cpp) and the memory plan (memory_plan.cpp). The model is built and compiled as the run builds it, so
// a trial step holds what the run's steps will hold.
#pragma once

#include <cstdint>
#include <memory>

#include "mixtrain/train/step_samples.h"
#include "mixtrain/train/model.h"
#include "mixtrain/train/run_config.h"

namespace mixtrain::detail {

// cfg's model under its policy, on cfg.device, compiled with the run's optimizer (its state dtype, accumulation
// and clipping) and loss. Precision warnings are not repeated: the real model shows them.
std::unique_ptr<Model> build_trial_model(const RunConfig& cfg, int64_t num_features, int64_t num_classes,
                                         const StepSamples& samples);

// One training step on `rows` rows of zeros as fit() gathers a batch: (rows, F) in the first layer's dtype, or
// (rows, T) ids with (rows, T) targets.
void run_trial_step(Model& model, int64_t rows, int64_t num_features, const StepSamples& samples);

}  // namespace mixtrain::detail
