// The fused update's stochastic rounding of a block of bfloat16 master weights (ops/shared/stochastic_round.h), in
// the widest instruction-set variant the level allows (core/isa_level.h): the counter hash is integer arithmetic
// and the rounding a select, so every variant gives float_to_bfloat16_sr's bits, element for element
// (tests/ops/update_isa_variants_test.cpp checks that at every level).
#pragma once

#include <cstdint>

namespace mixtrain::ops::cpu {

// out[j] = float_to_bfloat16_sr(x[j], seed, step, first_index + j) (stream 0) for j in [0, n).
void round_bfloat16_stochastic(const float* x, uint16_t* out, int64_t n, uint64_t seed, uint64_t step,
                               uint64_t first_index);

}  // namespace mixtrain::ops::cpu
