// The arithmetic of the loss-scaling kernels, written once for every backend: plain functions on raw state
// (no Tensor, no library calls), compiled as host code by the CPU backend and as host-and-device code by nvcc,
// so the rule a GPU runs is the one the CPU tests check.
#pragma once

#include <cstdint>

#include "host_device.h"
#include "mixtrain/ops/loss_scale.h"

namespace mixtrain::ops::shared {

// 1/S in double, rounded once: exact for the power-of-two scales dynamic scaling produces.
MIXTRAIN_HOST_DEVICE inline float inverse_scale(float scale) {
  return static_cast<float>(1.0 / static_cast<double>(scale));
}

// One step of the dynamic loss-scale rule (ops::update_loss_scale): scale_state {scale, min_scale_seen},
// counters indexed by LossScaleCounter.
MIXTRAIN_HOST_DEVICE inline void loss_scale_rule_step(float* scale_state, int32_t* counters, bool found_inf,
                                                      const LossScaleRule& rule) {
  constexpr int32_t kMax = 2147483647;
  auto bump = [counters](int c) {
    if (counters[c] < kMax) ++counters[c];
  };
  auto set_scale = [scale_state](float s) {
    scale_state[0] = s;
    if (s < scale_state[1]) scale_state[1] = s;
  };
  if (!found_inf) {
    counters[kLsAllFinite] = 1;
    counters[kLsLastSkipped] = 0;
    bump(kLsGood);
    counters[kLsFloorSkips] = 0;
    counters[kLsStuck] = 0;
    if (rule.dynamic) {
      bump(kLsGrowth);
      if (counters[kLsGrowth] >= rule.growth_steps) {
        counters[kLsGrowth] = 0;
        counters[kLsHysteresisLeft] = rule.hysteresis;
        const float grown = scale_state[0] * 2.0f;
        if (float_is_finite(grown) && grown <= rule.max_scale) set_scale(grown);
      }
    }
    return;
  }
  // Skipped: the optimizer's fused update read the same flag and changed nothing.
  const float scale = scale_state[0];
  const bool at_floor = !rule.dynamic || scale <= rule.min_scale;
  counters[kLsAllFinite] = 0;
  counters[kLsLastSkipped] = 1;
  bump(kLsSkipped);
  counters[kLsGood] = 0;
  counters[kLsGrowth] = 0;
  if (rule.dynamic) {
    counters[kLsHysteresisLeft] = counters[kLsHysteresisLeft] > 1 ? counters[kLsHysteresisLeft] - 1 : 0;
    // min_scale > 0 is enforced, so the scale can never reach 0 (Keras 3's 0/0 = NaN trap).
    if (counters[kLsHysteresisLeft] == 0) {
      const float halved = scale * 0.5f;
      set_scale(halved > rule.min_scale ? halved : rule.min_scale);
    }
  }
  if (at_floor)
    bump(kLsFloorSkips);
  else
    counters[kLsFloorSkips] = 0;
  if (rule.floor_alarm_steps > 0 && counters[kLsFloorSkips] == rule.floor_alarm_steps && counters[kLsStuck] == 0) {
    counters[kLsStuck] = 1;
    bump(kLsAlarms);
  }
}

}  // namespace mixtrain::ops::shared
