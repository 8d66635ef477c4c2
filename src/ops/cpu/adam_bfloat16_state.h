// Adam's update of a block whose moments are bfloat16 (UpdateConstants::bfloat16_state), in one pass per instruction
// set: each moment widened, the float32 rule of update_spans.cpp, each moment rounded back once. The element
// function of the device kernels (ops/shared/fused_update_element.h) in a loop that vectorises; every variant gives
// its bits (tests/ops/update_isa_variants_test.cpp).
#pragma once

#include <cstdint>

#include "mixtrain/ops/fused_update.h"

namespace mixtrain::ops::cpu {

// n float32 weights w with gradients g and bfloat16 moments m, v (bit patterns) of run class cls (AdamW decays class
// 1); under rule.stochastic_rounding the moments draw from the hash of (seed, counter, first_index + j), streams 1
// and 2 (ops/shared/stochastic_round.h), else round to nearest.
void adam_bfloat16_state(const UpdateConstants& rule, const UpdateRates& rates, float* w, const float* g, uint16_t* m,
                         uint16_t* v, int64_t n, int cls, int64_t counter, int64_t first_index);

}  // namespace mixtrain::ops::cpu
