// bfloat16 <-> float32 array conversion with AVX-512F (compiled with -mavx512f for this file only; called
// only after a run-time check). Integer arithmetic, exactly as half.h's scalar code: round to nearest
// even, NaN quieted, subnormals kept (vcvtneps2bf16 would flush them, so it is not used).
//
// GCC 12 reports "'__Y' may be used uninitialized" from inside its own avx512fintrin.h for the intrinsics below
// (their unused pass-through operand is _mm512_undefined_epi32(); GCC bug 105593, fixed in GCC 13). The warning
// is false and names no line of ours, so it is silenced for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

#include "mixtrain/core/half.h"

namespace mixtrain::detail {

void bf16_to_float_avx512(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    _mm512_storeu_si512(dst + i, _mm512_slli_epi32(wide, 16));
  }
  for (; i < n; ++i) dst[i] = bf16_bits_to_float(src[i]);
}

void float_to_bf16_avx512(const float* src, uint16_t* dst, int64_t n) {
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7FFF);
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
  const __m512i quiet = _mm512_set1_epi32(0x0040);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_loadu_si512(src + i);
    const __m512i high = _mm512_srli_epi32(u, 16);
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, bias), _mm512_and_si512(high, one)), 16);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, abs_mask), inf);
    const __m512i result = _mm512_mask_or_epi32(rounded, nan, high, quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(result));
  }
  for (; i < n; ++i) dst[i] = float_to_bf16_bits(src[i]);
}

}  // namespace mixtrain::detail
