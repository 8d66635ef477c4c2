// float8 (E4M3, E5M2) <-> float32 / bfloat16 array conversion with AVX-512 F (compiled with -mavx512f for this file
// only; called only at the avx512 level). Sixteen lanes at a time, the same bits as float8.h's scalar code: normal
// results by integer rounding (rebias, add the round-to-nearest-even bias, shift), subnormal results by adding a
// power of two whose unit in the last place is the format's smallest subnormal (the hardware's round to nearest
// even does the rounding), then overflow, infinity and NaN by masks. Tails go through the scalar code.
#include <immintrin.h>

#include <cstdint>

#include "mixtrain/core/float8.h"

namespace mixtrain::detail {

namespace {

struct Format {
  int drop;             // float32 mantissa bits dropped: 23 - mantissa bits
  uint32_t rebias;      // (127 - bias) << 23
  uint32_t min_normal;  // bits of the smallest normal value
  uint32_t magic;       // bits of 2^k whose ulp is the smallest subnormal
  uint32_t max_code;    // largest finite code
  uint32_t over_code;   // what overflow gives when not saturating (E4M3 NaN, E5M2 infinity)
};

constexpr Format kE4M3{20, 120u << 23, 121u << 23, 141u << 23, 0x7Eu, 0x7Fu};
constexpr Format kE5M2{21, 112u << 23, 113u << 23, 134u << 23, 0x7Bu, 0x7Cu};

// 16 float32 bit patterns to 16 codes (in the low byte of each lane).
inline __m512i encode16(__m512i u, const Format& f, bool e5m2, bool saturate) {
  const __m512i absu = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(absu, f.drop), _mm512_set1_epi32(1));
  const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>((1u << (f.drop - 1)) - 1u)), odd);
  const __m512i normal = _mm512_srli_epi32(
      _mm512_sub_epi32(_mm512_add_epi32(absu, bias), _mm512_set1_epi32(static_cast<int>(f.rebias))), f.drop);
  const __m512 magic = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(f.magic)));
  const __m512i sub = _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(absu), magic)),
                                       _mm512_set1_epi32(static_cast<int>(f.magic)));
  const __mmask16 is_sub = _mm512_cmplt_epu32_mask(absu, _mm512_set1_epi32(static_cast<int>(f.min_normal)));
  __m512i code = _mm512_mask_blend_epi32(is_sub, normal, sub);
  // Infinity rounds like a huge finite value (its code is past the largest), so overflow covers it.
  const __mmask16 over = _mm512_cmpgt_epu32_mask(code, _mm512_set1_epi32(static_cast<int>(f.max_code)));
  code = _mm512_mask_mov_epi32(code, over, _mm512_set1_epi32(static_cast<int>(saturate ? f.max_code : f.over_code)));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(absu, _mm512_set1_epi32(0x7F800000));
  const __m512i nan_code = e5m2 ? _mm512_or_si512(_mm512_set1_epi32(0x7E),
                                                  _mm512_and_si512(_mm512_srli_epi32(absu, 21), _mm512_set1_epi32(3)))
                                : _mm512_set1_epi32(0x7F);
  code = _mm512_mask_mov_epi32(code, nan, nan_code);
  return _mm512_or_si512(code, sign);
}

// 16 codes (one per 32-bit lane) to 16 float32 bit patterns.
inline __m512i decode16(__m512i b, bool e5m2) {
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x80)), 24);
  const __m512i mag = _mm512_and_si512(b, _mm512_set1_epi32(0x7F));
  const int shift = e5m2 ? 21 : 20;
  const __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(mag, shift), _mm512_set1_epi32(e5m2 ? 112 << 23 : 120 << 23));
  const __m512 unit = _mm512_set1_ps(e5m2 ? 1.52587890625e-05f : 0.001953125f);  // 2^-16, 2^-9
  const __m512i sub = _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(mag), unit));
  const __mmask16 is_sub = _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(e5m2 ? 4 : 8));
  __m512i bits = _mm512_mask_blend_epi32(is_sub, normal, sub);
  if (e5m2) {  // exponent 31: infinity, or NaN quieted with its payload (as half.h widens float16)
    const __m512i m = _mm512_and_si512(mag, _mm512_set1_epi32(3));
    const __mmask16 has_payload = _mm512_test_epi32_mask(m, m);
    const __m512i inf = _mm512_or_si512(_mm512_set1_epi32(0x7F800000), _mm512_slli_epi32(m, 21));
    const __m512i special = _mm512_mask_or_epi32(inf, has_payload, inf, _mm512_set1_epi32(0x00400000));
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmpge_epu32_mask(mag, _mm512_set1_epi32(0x7C)), special);
  } else {
    bits = _mm512_mask_mov_epi32(bits, _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7F)), _mm512_set1_epi32(0x7FC00000));
  }
  return _mm512_or_si512(bits, sign);
}

inline __m512i load16_codes(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

}  // namespace

void float8_from_float_avx512(const float* src, uint8_t* dst, int64_t n, bool e5m2, Float8Overflow overflow) {
  const Format& f = e5m2 ? kE5M2 : kE4M3;
  const bool saturate = overflow == Float8Overflow::kSaturate;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm512_cvtepi32_epi8(encode16(_mm512_loadu_si512(src + i), f, e5m2, saturate)));
  for (; i < n; ++i) dst[i] = e5m2 ? float_to_e5m2_bits(src[i], overflow) : float_to_e4m3_bits(src[i], overflow);
}

void float8_from_bfloat16_avx512(const bfloat16* src, uint8_t* dst, int64_t n, bool e5m2, Float8Overflow overflow) {
  const Format& f = e5m2 ? kE5M2 : kE4M3;
  const bool saturate = overflow == Float8Overflow::kSaturate;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m512i u = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);  // bfloat16 widens exactly
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm512_cvtepi32_epi8(encode16(u, f, e5m2, saturate)));
  }
  for (; i < n; ++i) {
    const float x = bf16_bits_to_float(src[i].bits);
    dst[i] = e5m2 ? float_to_e5m2_bits(x, overflow) : float_to_e4m3_bits(x, overflow);
  }
}

void float8_to_float_avx512(const uint8_t* src, float* dst, int64_t n, bool e5m2) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_si512(dst + i, decode16(load16_codes(src + i), e5m2));
  for (; i < n; ++i) dst[i] = e5m2 ? e5m2_bits_to_float(src[i]) : e4m3_bits_to_float(src[i]);
}

void float8_to_bfloat16_avx512(const uint8_t* src, bfloat16* dst, int64_t n, bool e5m2) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    // Every E4M3 / E5M2 value is a bfloat16 value: the float32 pattern's top half is exact.
    const __m512i bits = _mm512_srli_epi32(decode16(load16_codes(src + i), e5m2), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(bits));
  }
  for (; i < n; ++i) {
    const float x = e5m2 ? e5m2_bits_to_float(src[i]) : e4m3_bits_to_float(src[i]);
    dst[i] = bfloat16{static_cast<uint16_t>(float_bits(x) >> 16)};
  }
}

}  // namespace mixtrain::detail
