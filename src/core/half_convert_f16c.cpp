// float16 <-> float32 array conversion with the F16C instructions (compiled with -mf16c -mavx2 for this
// file only; called only after a run-time check). The hardware conversion is IEEE-exact: round to nearest
// even, subnormals kept, NaN quieted with its payload's top bits — bit-identical to half.h's scalar code.
#include <immintrin.h>

#include <cstdint>

#include "mixtrain/core/half.h"

namespace mixtrain::detail {

void half_to_float_f16c(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = half_bits_to_float(src[i]);
}

void float_to_half_f16c(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = float_to_half_bits(src[i]);
}

}  // namespace mixtrain::detail
