// The Kahan passes of bfloat16 master weights (kahan_round_span.h), written once as always-inline loops and
// compiled per instruction-set level like the stochastic rounding pass (stochastic_round_span.cpp). Round to
// nearest is float_to_bf16_bits' integer formula with its NaN case a select, and the special cases of the
// compensation are selects too, so the loops vectorise and keep the scalar functions' bits.
#include "kahan_round_span.h"

#include <cstring>

#include "mixtrain/core/isa_level.h"

namespace mixtrain::ops::cpu {

namespace {

constexpr uint32_t kExponent = 0x7F800000u;

// float_to_bf16_bits: round to nearest even, NaN quieted.
[[gnu::always_inline]] inline uint32_t nearest_bfloat16(uint32_t bits) {
  const uint32_t nan_quieted = (bits >> 16) | 0x0040u;
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  return (bits & 0x7FFFFFFFu) > kExponent ? nan_quieted : rounded;
}

[[gnu::always_inline]] inline float widened(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

[[gnu::always_inline]] inline void widen_span(const uint16_t* w, const uint16_t* c, float* out, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = widened(w[j]) + widened(c[j]);
}

[[gnu::always_inline]] inline void split_span(const float* x, uint16_t* w, uint16_t* c, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    uint32_t bits;
    std::memcpy(&bits, x + j, sizeof bits);
    const uint32_t hi = nearest_bfloat16(bits);
    const float rest = x[j] - widened(static_cast<uint16_t>(hi));  // exact: hi is within a factor of 2 of x
    uint32_t rest_bits;
    std::memcpy(&rest_bits, &rest, sizeof rest_bits);
    w[j] = static_cast<uint16_t>(hi);
    c[j] = static_cast<uint16_t>((rest_bits & kExponent) == kExponent ? 0u : nearest_bfloat16(rest_bits));
  }
}

using WidenSpan = void (*)(const uint16_t*, const uint16_t*, float*, int64_t);
using SplitSpan = void (*)(const float*, uint16_t*, uint16_t*, int64_t);
void widen_scalar(const uint16_t* w, const uint16_t* c, float* out, int64_t n) { widen_span(w, c, out, n); }
[[gnu::target("avx2")]] void widen_avx2(const uint16_t* w, const uint16_t* c, float* out, int64_t n) {
  widen_span(w, c, out, n);
}
[[gnu::target("avx512f,avx512bw,avx512vl")]] void widen_avx512(const uint16_t* w, const uint16_t* c, float* out,
                                                                 int64_t n) {
  widen_span(w, c, out, n);
}
void split_scalar(const float* x, uint16_t* w, uint16_t* c, int64_t n) { split_span(x, w, c, n); }
[[gnu::target("avx2")]] void split_avx2(const float* x, uint16_t* w, uint16_t* c, int64_t n) {
  split_span(x, w, c, n);
}
[[gnu::target("avx512f,avx512bw,avx512vl")]] void split_avx512(const float* x, uint16_t* w, uint16_t* c,
                                                                 int64_t n) {
  split_span(x, w, c, n);
}

}  // namespace

void widen_bfloat16_kahan(const uint16_t* w, const uint16_t* c, float* out, int64_t n) {
  for_isa_level<WidenSpan>(widen_scalar, widen_avx2, widen_avx512)(w, c, out, n);
}

void round_bfloat16_kahan(const float* x, uint16_t* w, uint16_t* c, int64_t n) {
  for_isa_level<SplitSpan>(split_scalar, split_avx2, split_avx512)(x, w, c, n);
}

}  // namespace mixtrain::ops::cpu
