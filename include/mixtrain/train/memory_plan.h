// Where a training run's memory will go, said before it starts (train --memory-plan, bench step --memory-plan):
// the float32 weights, the float32 gradients, the optimizer's slots, the 16-bit compute copies the arena keeps,
// and what one step holds at its peak beyond those (activations kept for backward, gradients in flight, GEMM
// workspace, the batch). The persistent parts come from a trial model built and stepped as the run will build it;
// the step's part is measured on trial batches of a quarter and a half of the batch and extended along the straight
// line through them, since activations grow with the rows of the batch. So the plan knows what the measurement knows (the policy, the
// optimizer state's dtype, accumulation, recomputation, the fused loss, tiled attention) without a step at the
// full batch. After training the allocator's measured peak is set beside it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/core/json.h"
#include "mixtrain/data/dataset.h"
#include "mixtrain/train/step_samples.h"
#include "mixtrain/train/run_config.h"

namespace mixtrain {

struct MemoryPlan {
  int64_t batch_size = 0;             // the rows of one step (this rank's, under data parallelism)
  int64_t weight_bytes = 0;           // the variables as built (float32 master weights under mixed policies)
  int64_t gradient_bytes = 0;         // the float32 gradient buffer of the trainable weights
  int64_t optimizer_state_bytes = 0;  // the optimizer's slots (Adam's m and v) in their dtype
  int64_t compute_copy_bytes = 0;     // the rest of what training keeps between steps: 16-bit weight copies, caches
  int64_t step_bytes = 0;             // one step's peak beyond the above, at batch_size
  int64_t step_fixed_bytes = 0;       // the straight line step_bytes lies on: fixed + per_row * batch
  double step_bytes_per_row = 0;
  std::vector<std::pair<int64_t, int64_t>> probes;  // (trial batch rows, its step bytes measured)
  // fit()'s validation passes, which run beside the training state at their own batch (a step's rows unless
  // FitOptions::validation_batch_size says otherwise): with a long context and full attention in evaluation a
  // batch can hold more than a training step does.
  int64_t evaluation_rows = 0;   // rows of one validation batch (0: no validation)
  int64_t evaluation_bytes = 0;  // its peak beyond the training state, on the line through two smaller trials

  // What training holds between steps (the persistent parts above).
  int64_t state_bytes() const {
    return weight_bytes + gradient_bytes + optimizer_state_bytes + compute_copy_bytes;
  }
  int64_t total_bytes() const { return state_bytes() + std::max(step_bytes, evaluation_bytes); }
};

// The plan for training cfg's model at `batch` rows per step, validating at `evaluation_rows` rows per batch (0:
// fit() validates nothing). num_features and samples as find_max_batch_size takes them. Builds a trial model
// (dropped before returning) and runs three trial steps (a quarter, a quarter and a half of the batch) and two
// evaluations (a quarter and a half of evaluation_rows).
// ranks: the data-parallel ranks; with cfg.zero_stage 1 each holds 1/ranks of the optimizer's slots.
MemoryPlan plan_training_memory(const RunConfig& cfg, int64_t num_features, int64_t num_classes, int64_t batch,
                                const StepSamples& samples = {}, int64_t evaluation_rows = 0, int ranks = 1);

// The plan for run_training(cfg, data): this rank's share of the batch (cfg.communicator), the data's sample shape,
// and fit()'s validation batches (validation_batch_rows).
MemoryPlan plan_run_memory(const RunConfig& cfg, const DataSplits& data);
// The rows of one of fit()'s validation batches in run_training(cfg, data) (0: it validates nothing): the validation
// text of a language model, or the rows split off for validation, in batches of this rank's share of the training
// batch (FitOptions::validation_rows_at_once; the run sets no validation_batch_size).
int64_t validation_batch_rows(const RunConfig& cfg, const DataSplits& data);

// Refuses a run whose plan exceeds budget_bytes (Error, kInvalidInput: exit status 2 in the CLI) in one line naming
// the plan's total, the budget (as `budget_name` calls it, e.g. "--memory-budget") and the plan's largest part; a
// plan within the budget passes. The plan is the run's peak within a few percent (docs/SCALING.md), so a run it
// passes trains within the budget, and one it refuses is refused before its model is built.
void check_plan_within_budget(const MemoryPlan& plan, int64_t budget_bytes, const std::string& budget_name);

// The plan as lines of text for the log: one per part, with MiB and its share of the total.
std::string memory_plan_text(const MemoryPlan& plan);
// One line setting a run's measured peak (the model's bytes and fit()'s peak above them) beside the plan.
std::string memory_measured_text(const MemoryPlan& plan, int64_t measured_peak_bytes);
// The plan in --json: bytes per part, the fitted line, the probes, and the measured peak when known.
Json memory_plan_json(const MemoryPlan& plan, int64_t measured_peak_bytes = -1);

}  // namespace mixtrain
