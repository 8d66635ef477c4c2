// float8 (E4M3, E5M2) <-> float32 / bfloat16 array conversion with AVX-512 F and BW (compiled with -mavx512f
// -mavx512bw for this file only; called only at the avx512 level, which requires both). Sixteen lanes at a time, the
// same bits as float8.h's scalar code (codes to bfloat16: 32 at a time from a table the scalar code fills): normal
// results by integer rounding (rebias, add the round-to-nearest-even bias, shift), subnormal results by adding a
// power of two whose unit in the last place is the format's smallest subnormal (the hardware's round to nearest
// even does the rounding), then overflow, infinity and NaN by masks. Tails go through the scalar code.
#include <immintrin.h>

#include <algorithm>
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

namespace {
// The bfloat16 bits of the 128 codes with the sign bit clear, from the scalar decoder (float8.h), one table per
// format: every E4M3 / E5M2 value is a bfloat16 value, so the float32 pattern's top half is exact. Built on first
// use, when this level is the one in use, so nothing here runs on a CPU without AVX-512.
struct Bf16Tables {
  alignas(64) uint16_t e4m3[128];
  alignas(64) uint16_t e5m2[128];
  Bf16Tables() {
    for (uint32_t c = 0; c < 128; ++c) {
      e4m3[c] = static_cast<uint16_t>(float_bits(e4m3_bits_to_float(static_cast<uint8_t>(c))) >> 16);
      e5m2[c] = static_cast<uint16_t>(float_bits(e5m2_bits_to_float(static_cast<uint8_t>(c))) >> 16);
    }
  }
};

// The format's table in four registers of 32 words, the tables built on the first call.
inline void load_table(bool e5m2, __m512i (&t)[4]) {
  static const Bf16Tables tables;
  const uint16_t* table = e5m2 ? tables.e5m2 : tables.e4m3;
  for (int k = 0; k < 4; ++k) t[k] = _mm512_load_si512(table + 32 * k);
}

// 32 codes (in the low byte of each 16-bit lane) to their bfloat16 bits through the four table registers (see
// float8_to_bfloat16_avx512).
inline __m512i widen32(__m512i c, const __m512i (&t)[4]) {
  const __m512i low = _mm512_permutex2var_epi16(t[0], c, t[1]);
  const __m512i high = _mm512_permutex2var_epi16(t[2], c, t[3]);
  const __m512i mag = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(c, _mm512_set1_epi16(0x40)), low, high);
  return _mm512_or_si512(mag, _mm512_slli_epi16(_mm512_and_si512(c, _mm512_set1_epi16(0x80)), 8));
}
}  // namespace

// 32 codes at a time by table lookup: the code's low 7 bits pick one of 128 words (two two-register permutes of 64
// words, then bit 6 picks between them), and the sign bit moves to the bfloat16 sign (the formats are sign and
// magnitude, NaNs included). Four times fewer instructions per value than decoding through float32 (decode16).
void float8_to_bfloat16_avx512(const uint8_t* src, bfloat16* dst, int64_t n, bool e5m2) {
  __m512i t[4];
  load_table(e5m2, t);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512i c = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    _mm512_storeu_si512(dst + i, widen32(c, t));
  }
  for (; i < n; ++i) {
    const float x = e5m2 ? e5m2_bits_to_float(src[i]) : e4m3_bits_to_float(src[i]);
    dst[i] = bfloat16{static_cast<uint16_t>(float_bits(x) >> 16)};
  }
}


namespace {
// 16 float32 values from x + i: float32 itself, or bfloat16 widened exactly.
inline __m512i load16_bits(const float* x, int64_t i) { return _mm512_loadu_si512(x + i); }
inline __m512i load16_bits(const bfloat16* x, int64_t i) {
  return _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i))), 16);
}

// float8_scale_encode_widen in one pass, 32 elements at a time: the amax as an unsigned maximum of the magnitudes'
// bits, the product with the scale (one float32 rounding, as the scalar loop's), encode16 and the table.
template <typename T>
uint32_t scale_encode_widen(const T* x, int64_t n, float scale, bool e5m2, Float8Overflow overflow, bfloat16* dst) {
  __m512i t[4];
  load_table(e5m2, t);
  const Format& f = e5m2 ? kE5M2 : kE4M3;
  const bool saturate = overflow == Float8Overflow::kSaturate;
  const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
  const __m512 s = _mm512_set1_ps(scale);
  __m512i amax = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512i u0 = load16_bits(x, i), u1 = load16_bits(x, i + 16);
    amax = _mm512_max_epu32(amax, _mm512_max_epu32(_mm512_and_si512(u0, magnitude), _mm512_and_si512(u1, magnitude)));
    const __m512i c0 = encode16(_mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(u0), s)), f, e5m2, saturate);
    const __m512i c1 = encode16(_mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(u1), s)), f, e5m2, saturate);
    const __m512i codes =
        _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(c0)), _mm512_cvtepi32_epi16(c1), 1);
    _mm512_storeu_si512(dst + i, widen32(codes, t));
  }
  uint32_t m = _mm512_reduce_max_epu32(amax);
  for (; i < n; ++i) {
    const float v = to_float(x[i]);  // half.h
    m = std::max(m, float_bits(v) & 0x7FFFFFFFu);
    const uint8_t code = e5m2 ? float_to_e5m2_bits(v * scale, overflow) : float_to_e4m3_bits(v * scale, overflow);
    const float w = e5m2 ? e5m2_bits_to_float(code) : e4m3_bits_to_float(code);
    dst[i] = bfloat16{static_cast<uint16_t>(float_bits(w) >> 16)};
  }
  return m;
}
}  // namespace

uint32_t float8_scale_encode_widen_avx512(const float* x, int64_t n, float scale, bool e5m2, Float8Overflow overflow,
                                          bfloat16* values) {
  return scale_encode_widen(x, n, scale, e5m2, overflow, values);
}
uint32_t float8_scale_encode_widen_avx512(const bfloat16* x, int64_t n, float scale, bool e5m2,
                                          Float8Overflow overflow, bfloat16* values) {
  return scale_encode_widen(x, n, scale, e5m2, overflow, values);
}

}  // namespace mixtrain::detail
