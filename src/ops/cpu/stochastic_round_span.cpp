// The stochastic rounding pass of bfloat16 master weights (stochastic_round_span.h), written
// once as an always-inline loop and compiled per instruction-set level like the update spans
// (update_isa_variants.h). The scalar float_to_bfloat16_stochastic branches on its special cases; here both
// roundings are computed and one selected, which the compiler vectorises (the 64-bit products are AVX-512 DQ's
// vpmullq, emulated from 32-bit products under AVX2). The scalar loop it replaces made bench step's bfloat16 MLP
// step with stochastic rounding 1.28x the step with round to nearest (docs/SCALING.md).
#include "stochastic_round_span.h"

#include <cstring>

#include "../shared/stochastic_round.h"
#include "mixtrain/core/isa_level.h"

namespace mixtrain::ops::cpu {

namespace {

[[gnu::always_inline]] inline void round_span(const float* x, uint16_t* out, int64_t n, uint64_t base,
                                              uint64_t first_index) {
  constexpr uint32_t kExponent = 0x7F800000u;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    uint32_t bits;
    std::memcpy(&bits, x + j, sizeof bits);
    const uint64_t index = first_index + static_cast<uint64_t>(j);
    const uint64_t hash = shared::counter_mix(base + shared::kCounterIndexStride * (index + 1));
    const uint32_t up = bits + shared::rounding_bits(hash, 0);
    // float_to_bf16_bits (round to nearest, NaN quieted) for infinities, NaN and a value that would round up past
    // the largest finite bfloat16.
    const uint32_t nan_quieted = (bits >> 16) | 0x0040u;
    const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    const uint32_t nearest = (bits & 0x7FFFFFFFu) > kExponent ? nan_quieted : rounded;
    const bool special = (bits & kExponent) == kExponent || (up & kExponent) == kExponent;
    out[j] = static_cast<uint16_t>(special ? nearest : up >> 16);
  }
}

using RoundSpan = void (*)(const float*, uint16_t*, int64_t, uint64_t, uint64_t);
void round_span_scalar(const float* x, uint16_t* out, int64_t n, uint64_t base, uint64_t first) {
  round_span(x, out, n, base, first);
}
[[gnu::target("avx2")]] void round_span_avx2(const float* x, uint16_t* out, int64_t n, uint64_t base,
                                             uint64_t first) {
  round_span(x, out, n, base, first);
}
[[gnu::target("avx512f,avx512dq,avx512bw,avx512vl")]] void round_span_avx512(const float* x, uint16_t* out,
                                                                            int64_t n, uint64_t base,
                                                                            uint64_t first) {
  round_span(x, out, n, base, first);
}

}  // namespace

void round_bfloat16_stochastic(const float* x, uint16_t* out, int64_t n, uint64_t seed, uint64_t step,
                               uint64_t first_index) {
  const RoundSpan span = for_isa_level<RoundSpan>(round_span_scalar, round_span_avx2, round_span_avx512);
  span(x, out, n, shared::counter_base(seed, step), first_index);
}

}  // namespace mixtrain::ops::cpu
