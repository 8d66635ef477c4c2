// The fused optimizer update of a flat parameter arena (optim/parameter_arena.h), one op per training step: what
// Optimizer::apply_flat_gradients runs when the arena lives on a device, for Adam, AdamW, SGD (with or without
// momentum, Nesterov) and RMSprop (momentum, centered). Per dtype group, one pass over the runs of variables to
// update: the gradient widened to float32 and, under global clipping, scaled by the factor of the global norm
// (ops/global_norm.h), read on the device; AdamW's decoupled weight decay on runs of class 1; the rule's element
// update; the value rounded once into its dtype and into each compute copy. The arithmetic is
// ops/shared/fused_update_element.h, each CPU optimizer's operations in its order, so every device gives the CPU
// optimizer's bits.
//
// The skip flag and the iteration count are read where they live, so a step reads nothing back to the host:
//   - found_inf (float32 (1,)) nonzero: nothing changes; the counter advances only when
//     step.skipped_steps_advance_iterations.
//   - otherwise every group is updated with rates[counter - first_iterations] and the counter advances by one.
// The host does not know how many skipped steps left the counter where it was, so it passes the rates of every
// count the counter may hold: first_iterations + k for 0 <= k < window (learning-rate schedules and Adam's bias
// correction are evaluated on the host, in double, as the CPU optimizer does).
#pragma once

#include <cstdint>
#include <vector>

#include "mixtrain/core/tensor.h"

namespace mixtrain::ops {

// How many iteration counts one step can cover (the host reads the counter back before it would need more).
constexpr int kRateWindow = 64;

enum class UpdateKind : int32_t { kAdam = 0, kSgd = 1, kRmsprop = 2 };

// A rule's constants, rounded to float32 as the CPU optimizer rounds them: plain values a device kernel takes.
struct UpdateConstants {
  UpdateKind kind = UpdateKind::kAdam;
  float one_minus_beta1 = 0;  // Adam: 1 - beta computed in double and rounded once
  float one_minus_beta2 = 0;
  float epsilon = 0;          // Adam, RMSprop
  float weight_decay = 0;     // AdamW: applied to runs of class 1
  float momentum = 0;         // SGD, RMSprop; 0: no momentum slot
  bool nesterov = false;      // SGD
  float rho = 0;              // RMSprop: rho and 1 - rho (in double, rounded once)
  float one_minus_rho = 0;
  bool centered = false;      // RMSprop: an average-gradient slot
};

// The slots the rule reads, in the optimizer's slot_names() order: Adam m, v; SGD its momentum (when > 0);
// RMSprop velocity, then momentum (when > 0), then the average gradient (when centered).
int slot_count(const UpdateConstants& rule);

// The rates of the update that follows `iterations` completed ones.
struct UpdateRates {
  float alpha = 0;          // Adam: lr * sqrt(1 - beta2^t) / (1 - beta1^t), t = iterations + 1, in double, rounded once
  float learning_rate = 0;  // lr: SGD's and RMSprop's step, AdamW's decay (w - w * weight_decay * lr)
};

// Everything of one step but the tensors.
struct FusedUpdateStep {
  UpdateConstants rule;
  float clip_norm = 0;  // global clipnorm (> 0; 0: none): gradients scaled by clip_factor(norm, clip_norm)
  bool skipped_steps_advance_iterations = false;
  int64_t first_iterations = 0;  // rates[k] is for the counter holding first_iterations + k
  int window = 1;                // rates used, 1..kRateWindow
  UpdateRates rates[kRateWindow] = {};
};

// One dtype group of the arena: flat 1-D buffers of capacity elements, on one device.
struct FusedUpdateGroup {
  Tensor values;               // float32, float16 or bfloat16
  Tensor grads;                // float32 or values' dtype
  std::vector<Tensor> slots;   // float32, slot_count(rule) of them
  std::vector<Tensor> copies;  // float16 / bfloat16 compute copies of float32 values (at most one per dtype)
  Tensor runs;                 // int64 (runs, 3): begin, count, class of each run of elements to update
  int64_t run_count = 0;       // rows of runs (known on the host, so the device's table is never read back)
};

// Validates the tensors (dtypes, sizes, one device) and calls the device's kernel. iterations: int64 (1,), the
// completed updates; found_inf may be null (never skip); global_norm, float32 (1,), is given exactly when
// step.clip_norm > 0.
void fused_update(std::vector<FusedUpdateGroup>& groups, const FusedUpdateStep& step, const Tensor* found_inf,
                  Tensor& iterations, const Tensor* global_norm = nullptr);

namespace kernel {
// The CPU kernel is the device kernels' reference (one element at a time through the shared functions); the CPU
// optimizer runs its own vectorised pass (src/optim/optimizer_arena.cpp), which gives the same bits.
using FusedUpdateFn = void(std::vector<FusedUpdateGroup>& groups, const FusedUpdateStep& step,
                           const Tensor* found_inf, Tensor& iterations, const Tensor* global_norm);
}  // namespace kernel

}  // namespace mixtrain::ops
