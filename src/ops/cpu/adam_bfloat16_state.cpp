// adam_bfloat16_state.h: Adam with bfloat16 moments, one pass per block compiled per instruction-set level like the
// update spans (update_isa_variants.h). Widening is a shift; both roundings are integer arithmetic and a select,
// written branch-free so the loop vectorises (the scalar float_to_bfloat16_stochastic branches on its special
// cases). Reading and writing the moments here, rather than widening them into scratch and rounding them back in
// passes of their own, keeps the block to one trip through the registers.
#include "adam_bfloat16_state.h"

#include <cmath>
#include <cstring>

#include "../shared/stochastic_round.h"
#include "mixtrain/core/isa_level.h"

namespace mixtrain::ops::cpu {

namespace {

struct Coefficients {
  float alpha, one_minus_b1, one_minus_b2, eps;
  float weight_decay, lr;  // AdamW's decay (class 1): w - (w * weight_decay) * lr
  uint64_t base;           // counter_base(seed, counter), for stochastic rounding
  uint64_t first_index;
};

[[gnu::always_inline]] inline float widen(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// x rounded into bfloat16: to nearest (float_to_bf16_bits), or with the random bits r (float_to_bfloat16_stochastic),
// as selects rather than branches.
template <bool Stochastic>
[[gnu::always_inline]] inline uint16_t narrow(float x, uint32_t r) {
  constexpr uint32_t kExponent = 0x7F800000u;
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t nearest = (bits & 0x7FFFFFFFu) > kExponent ? (bits >> 16) | 0x0040u : rounded;
  if (!Stochastic) return static_cast<uint16_t>(nearest);
  const uint32_t up = bits + r;
  const bool special = ((bits & kExponent) == kExponent) | ((up & kExponent) == kExponent);
  return static_cast<uint16_t>(special ? nearest : up >> 16);
}

template <bool Stochastic, bool Decays>
[[gnu::always_inline]] inline void span(float* __restrict w, const float* __restrict g, uint16_t* __restrict m,
                                        uint16_t* __restrict v, int64_t n, const Coefficients& c) {
  const float alpha = c.alpha, b1 = c.one_minus_b1, b2 = c.one_minus_b2, eps = c.eps, wd = c.weight_decay, lr = c.lr;
  const uint64_t base = c.base, first = c.first_index;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float wi = w[i];
    if (Decays) wi = wi - wi * wd * lr;
    float mi = widen(m[i]), vi = widen(v[i]);
    mi += (g[i] - mi) * b1;
    vi += (g[i] * g[i] - vi) * b2;
    w[i] = wi - (mi * alpha) / (std::sqrt(vi) + eps);
    const uint64_t index = first + static_cast<uint64_t>(i);
    const uint64_t hash = Stochastic ? shared::counter_mix(base + shared::kCounterIndexStride * (index + 1)) : 0;
    m[i] = narrow<Stochastic>(mi, shared::rounding_bits(hash, 1));
    v[i] = narrow<Stochastic>(vi, shared::rounding_bits(hash, 2));
  }
}

// The four cases of one instruction set.
[[gnu::always_inline]] inline void span_any(float* w, const float* g, uint16_t* m, uint16_t* v, int64_t n,
                                            const Coefficients& c, bool stochastic, bool decays) {
  if (stochastic) {
    decays ? span<true, true>(w, g, m, v, n, c) : span<true, false>(w, g, m, v, n, c);
  } else {
    decays ? span<false, true>(w, g, m, v, n, c) : span<false, false>(w, g, m, v, n, c);
  }
}

using Span = void (*)(float*, const float*, uint16_t*, uint16_t*, int64_t, const Coefficients&, bool, bool);
void span_scalar(float* w, const float* g, uint16_t* m, uint16_t* v, int64_t n, const Coefficients& c, bool s,
                 bool d) {
  span_any(w, g, m, v, n, c, s, d);
}
[[gnu::target("avx2")]] void span_avx2(float* w, const float* g, uint16_t* m, uint16_t* v, int64_t n,
                                       const Coefficients& c, bool s, bool d) {
  span_any(w, g, m, v, n, c, s, d);
}
[[gnu::target("avx512f,avx512dq,avx512bw,avx512vl")]] void span_avx512(float* w, const float* g, uint16_t* m,
                                                                      uint16_t* v, int64_t n, const Coefficients& c,
                                                                      bool s, bool d) {
  span_any(w, g, m, v, n, c, s, d);
}

}  // namespace

void adam_bfloat16_state(const UpdateConstants& rule, const UpdateRates& rates, float* w, const float* g, uint16_t* m,
                         uint16_t* v, int64_t n, int cls, int64_t counter, int64_t first_index) {
  Coefficients c{};
  c.alpha = rates.alpha;
  c.one_minus_b1 = rule.one_minus_beta1;
  c.one_minus_b2 = rule.one_minus_beta2;
  c.eps = rule.epsilon;
  c.weight_decay = rule.weight_decay;
  c.lr = rates.learning_rate;
  c.base = shared::counter_base(rule.rounding_seed, static_cast<uint64_t>(counter));
  c.first_index = static_cast<uint64_t>(first_index);
  const Span run = for_isa_level<Span>(span_scalar, span_avx2, span_avx512);
  run(w, g, m, v, n, c, rule.stochastic_rounding, cls == 1);
}

}  // namespace mixtrain::ops::cpu
