// The fused update's Kahan compensation of a block of bfloat16 master weights (ops/shared/kahan_round.h), in the
// widest instruction-set variant the level allows (core/isa_level.h): additions, subtractions and bit selects, so
// every variant gives kahan_widen's and kahan_split's bits, element for element
// (tests/ops/update_isa_variants_test.cpp checks that at every level).
#pragma once

#include <cstdint>

namespace mixtrain::ops::cpu {

// out[j] = kahan_widen(w[j], c[j]) for j in [0, n): the compensated weights the update runs on.
void widen_bfloat16_kahan(const uint16_t* w, const uint16_t* c, float* out, int64_t n);
// kahan_split(x[j], &w[j], &c[j]) for j in [0, n).
void round_bfloat16_kahan(const float* x, uint16_t* w, uint16_t* c, int64_t n);

}  // namespace mixtrain::ops::cpu
