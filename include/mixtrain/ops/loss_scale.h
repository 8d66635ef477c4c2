// Loss-scaling ops: the fused unscale-and-check a LossScaleOptimizer runs over scaled gradients, and the dynamic
// loss-scale rule as an op on the scaler's state tensors. The finite test is the one of count_nonfinite
// (elementwise.h): an element is non-finite when every exponent bit of its float32 value is set.
//
// A training step chains them without reading anything back to the host: unscale_and_check reads the scale from
// its state tensor and raises a found_inf flag tensor; the optimizer's fused update reads the flag and skips
// (Optimizer::apply_flat_gradients); update_loss_scale reads the flag and moves the scale and counters. On a GPU
// the three are kernels on one stream; the host reads the state only to log it.
#pragma once

#include <cstdint>

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

// The slots of a loss scaler's int32 counter tensor.
enum LossScaleCounter : int {
  kLsGrowth = 0,      // finite steps since the last growth or skip
  kLsHysteresisLeft,  // overflows still tolerated before halving
  kLsSkipped,         // skipped steps in all
  kLsGood,            // finite steps since the last skipped one
  kLsFloorSkips,      // consecutive skipped steps taken at the floor
  kLsLastSkipped,     // the last step was skipped
  kLsStuck,           // the floor alarm fired and no finite step followed
  kLsAllFinite,       // the last step's gradients were all finite
  kLsAlarms,          // floor alarms raised so far (the host tells them, when it reads the counters)
  kLsNumCounters
};

// The dynamic loss-scale rule's parameters (precision/loss_scale_optimizer.h documents each).
struct LossScaleRule {
  bool dynamic = true;
  int64_t growth_steps = 2000;
  float min_scale = 1.0f / 16384.0f;
  float max_scale = 16777216.0f;
  int32_t hysteresis = 1;
  int64_t floor_alarm_steps = 50;
};

// out = scaled * inv_scale in float32 (each element widened to float32, multiplied once, not rounded again),
// and the number of inf or NaN elements of out. Testing the unscaled value also catches a finite scaled
// gradient that overflows when the scale is below 1. scaled: any floating dtype and shape; out: a contiguous
// float32 tensor with scaled's element count on scaled's device, which may be scaled itself (float32).
int64_t unscale_and_count_nonfinite(const Tensor& scaled, float inv_scale, Tensor& out);
// In place on a contiguous float32 tensor (an arena's flat gradient buffer): grads *= inv_scale.
int64_t unscale_and_count_nonfinite(Tensor& grads, float inv_scale);

// The same pass with the scale read on the device: out = scaled * (1/S), S = scale_state[0] (float32; 1/S computed
// in double and rounded once), and found_inf (float32 (1,)) set to 1 when an element of out is inf or NaN, left as
// it was otherwise, so one flag gathers several buffers. Returns nothing: the flag stays where it is.
void unscale_and_check(const Tensor& scaled, const Tensor& scale_state, Tensor& found_inf, Tensor& out);
// In place on a contiguous float32 tensor.
void unscale_and_check(Tensor& grads, const Tensor& scale_state, Tensor& found_inf);

// One step of the dynamic loss-scale rule, on the device: found_inf (float32 (1,), nonzero = skipped step) moves
// scale_state (float32 (2,): scale, smallest scale seen) and counters (int32 (kLsNumCounters,)). A finite step
// counts towards growth (the scale doubles after growth_steps of them, up to max_scale, refilling the hysteresis);
// a skipped one spends hysteresis, halves the scale (not below min_scale) when it is spent, and counts floor skips
// towards the alarm. Counters saturate at the int32 maximum.
void update_loss_scale(Tensor& scale_state, Tensor& counters, const Tensor& found_inf, const LossScaleRule& rule);

// loss * S in float32 (16-bit losses widened first, so the product cannot overflow), S = scale_state[0] read on
// the device: the seed of a scaled backward pass.
Tensor apply_loss_scale(const Tensor& loss, const Tensor& scale_state);

namespace kernel {
// out (float32, n) = loss (n) * scale_state[0].
using ApplyLossScaleFn = void(const Tensor& loss, const Tensor& scale_state, Tensor& out);
// out (float32, n) = scaled (n) * inv_scale; returns the non-finite count of out. out may alias scaled.
using UnscaleFn = int64_t(const Tensor& scaled, float inv_scale, Tensor& out);
// out = scaled * (1 / scale_state[0]); found_inf[0] = 1 when out has an inf or NaN. out may alias scaled.
using UnscaleCheckFn = void(const Tensor& scaled, const Tensor& scale_state, Tensor& found_inf, Tensor& out);
using UpdateLossScaleFn = void(Tensor& scale_state, Tensor& counters, const Tensor& found_inf,
                               const LossScaleRule& rule);
}  // namespace kernel
MIXTRAIN_KERNEL_SIGNATURE(apply_loss_scale, ApplyLossScaleFn)
MIXTRAIN_KERNEL_SIGNATURE(unscale_and_count_nonfinite, UnscaleFn)
MIXTRAIN_KERNEL_SIGNATURE(unscale_and_check, UnscaleCheckFn)
MIXTRAIN_KERNEL_SIGNATURE(update_loss_scale, UpdateLossScaleFn)

}  // namespace mixtrain::ops
