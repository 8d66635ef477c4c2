// The fused optimizer update of a flat parameter arena (optim/parameter_arena.h), one op per training step: what
// Optimizer::apply_flat_gradients runs on every device, the CPU included, for Adam, AdamW, SGD (with or without
// momentum, Nesterov) and RMSprop (momentum, centered), and on the CPU for a rule of an optimizer's own too. Per dtype group, one pass over the runs of variables to
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
#include <functional>
#include <vector>

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/kernel_list.h"

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
  // bfloat16 master weights: the new value of a bfloat16 group rounds stochastically (ops/shared/stochastic_round.h)
  // with the random bits of (rounding_seed, completed iterations, element offset in the group), instead of to
  // nearest, so updates below half an ulp still move the weights on average. Other dtypes are unaffected.
  // With bfloat16_state, Adam's moments round stochastically too (from the same hash's other bits).
  bool stochastic_rounding = false;
  uint64_t rounding_seed = 0;
  // Adam: the slots m and v are bfloat16 (AdamOptions::optimizer_state): read and widened to float32, updated in
  // float32 as ever, rounded once back (to nearest, or stochastically under stochastic_rounding). Other rules
  // keep float32 slots.
  bool bfloat16_state = false;
  // Adam: Kahan compensation of bfloat16 master weights (AdamOptions::kahan_summation): a third slot, always
  // bfloat16, holds each weight's rounding error. A bfloat16 group's update runs on w + c in float32 and stores
  // w = round(w + c) and c = round((w + c) - w) (ops/shared/kahan_round.h), so updates below half an ulp add up
  // exactly, not on average. Other dtypes' weights ignore the slot (it stays zero). Not with stochastic_rounding.
  bool kahan_summation = false;
};

// The slots the rule reads, in the optimizer's slot_names() order: Adam m, v (and the compensation under
// kahan_summation); SGD its momentum (when > 0);
// RMSprop velocity, then momentum (when > 0), then the average gradient (when centered).
int slot_count(const UpdateConstants& rule);

// The rates of the update that follows `iterations` completed ones.
struct UpdateRates {
  float alpha = 0;          // Adam: lr * sqrt(1 - beta2^t) / (1 - beta1^t), t = iterations + 1, in double, rounded once
  float learning_rate = 0;  // lr: SGD's and RMSprop's step, AdamW's decay (w - w * weight_decay * lr)
};

// A rule with no constants here (an optimizer's own update_span()), which the CPU kernel alone runs: update is
// called on blocks of n consecutive float32 elements of one run class (on several threads at once), slots[k] at the
// same elements of the group's slot k. Element-wise, so any split of a run gives the same bits.
struct SpanRule {
  std::function<void(float* value, const float* grad, float* const* slots, int64_t n, int cls)> update;
  int slots = 0;  // how many slots each group holds
};

// Everything of one step but the tensors.
struct FusedUpdateStep {
  UpdateConstants rule;
  const SpanRule* span_rule = nullptr;  // when set, runs in place of `rule` (on the CPU only)
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
  std::vector<Tensor> slots;   // float32 (bfloat16 under rule.bfloat16_state; Adam's compensation bfloat16 always),
                               // slot_count(rule) of them
  std::vector<Tensor> copies;  // float16 / bfloat16 compute copies of float32 values (at most one per dtype)
  Tensor runs;                 // int64 (runs, 3): begin, count, class of each run of elements to update
  int64_t run_count = 0;       // rows of runs (known on the host, so the device's table is never read back)
};

// Validates the tensors (dtypes, sizes, one device) and calls the device's kernel. iterations: int64 (1,), the
// completed updates; found_inf may be null (never skip); global_norm, float32 (1,), is given exactly when
// step.clip_norm > 0. A step with a span_rule runs on the CPU only.
void fused_update(std::vector<FusedUpdateGroup>& groups, const FusedUpdateStep& step, const Tensor* found_inf,
                  Tensor& iterations, const Tensor* global_norm = nullptr);

// The rule's update of n consecutive float32 elements in host memory, of class cls (AdamW decays class 1), at
// `rates`: what the CPU kernel runs on each block of a run, in the widest instruction-set variant the level allows
// (core/isa_level.h; every variant gives the same bits), across threads from 65,536 elements. slots[k] points at
// the same elements of slot k (slot_count(rule) of them). For the optimizers' update variable by variable.
void update_span(const UpdateConstants& rule, const UpdateRates& rates, float* value, const float* grad,
                 float* const* slots, int64_t n, int cls);

// Adam's constants: 1 - beta1 and 1 - beta2 computed in double and rounded once, epsilon as given.
UpdateConstants adam_constants(double beta1, double beta2, float epsilon);
// Adam's step size after `iterations` completed updates: lr * sqrt(1 - beta2^t) / (1 - beta1^t), t = iterations + 1,
// in double, rounded once (the CPU's and the device's, from the same function).
float adam_alpha(float learning_rate, double beta1, double beta2, int64_t iterations);

// Global clipping's decision, the one every update makes: false when norm is finite and <= clip_norm; otherwise
// true, with *factor the float32 rounding of clip_norm / norm in double, or NaN for a norm that is not finite.
bool clip_factor(float norm, float clip_norm, float* factor);

namespace kernel {
// The CPU kernel is a blocked, vectorised pass over the runs across threads (src/ops/cpu/fused_update.cpp).
using FusedUpdateFn = void(std::vector<FusedUpdateGroup>& groups, const FusedUpdateStep& step,
                           const Tensor* found_inf, Tensor& iterations, const Tensor* global_norm);
// The device kernels' reference on the CPU: one element at a time through the arithmetic they share
// (src/ops/shared/fused_update_element.h), which gives the CPU kernel's bits. Not the CPU backend's kernel: tests
// install it in its place (KernelOverride) to check the device path on any machine. Refuses a span_rule.
void fused_update_reference(std::vector<FusedUpdateGroup>& groups, const FusedUpdateStep& step,
                            const Tensor* found_inf, Tensor& iterations, const Tensor* global_norm);
}  // namespace kernel
MIXTRAIN_KERNEL_SIGNATURE(fused_update, FusedUpdateFn)

}  // namespace mixtrain::ops
