// Data movement for packing 16-bit operands into 32-bit pair slots (both the AMX and the AVX512-FP16
// kernels pack that way), with AVX-512 instructions. pack_shim_emulated.h has the same functions in
// portable C++. Include only from files compiled with -mavx512f/bw/vl/dq -mfma -mf16c (through a kernel
// shim: amx_shim_native.h, fp16_shim_native.h).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/gemm_avx512_common.h"

namespace mixtrain::kernels::cpu {
namespace {
namespace shim {

// dst[c] = even[c] | odd[c] << 16 for c < n (n <= 16; odd may be null: zero high halves), zero for c >= n.
inline void interleave_pairs(const uint16_t* even, const uint16_t* odd, int n, uint32_t* dst) {
  const __mmask16 mask = first_lanes(n);
  __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, even));
  if (odd != nullptr) v = _mm512_or_si512(v, _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, odd)), 16));
  _mm512_store_si512(dst, v);
}

// The same for 32 columns in one go: columns 0..15 to dst0, 16..31 to dst1 (n <= 32), one vpermt2w each.
inline void interleave_pairs32(const uint16_t* even, const uint16_t* odd, int n, uint32_t* dst0, uint32_t* dst1) {
  const __mmask32 mask = n >= 32 ? 0xFFFFFFFFu : ((1u << n) - 1u);
  const __m512i e = _mm512_maskz_loadu_epi16(mask, even);
  const __m512i o = odd != nullptr ? _mm512_maskz_loadu_epi16(mask, odd) : _mm512_setzero_si512();
  // Word i of the result takes word i / 2 of e (even i) or of o (odd i; indices from 32 pick o).
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5,
                                      36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  _mm512_store_si512(dst0, _mm512_permutex2var_epi16(e, lo, o));
  _mm512_store_si512(dst1, _mm512_permutex2var_epi16(e, hi, o));
}

// dst[0..32) = src[0..n) then zeros (n <= 32): one row of a 16x32 bfloat16 A tile.
inline void copy_row32(const uint16_t* src, int n, uint16_t* dst) {
  const __mmask32 mask = n >= 32 ? 0xFFFFFFFFu : ((1u << n) - 1u);
  _mm512_store_si512(dst, _mm512_maskz_loadu_epi16(mask, src));
}

// Reads `rows` (<= 16) rows of `halves` (<= 32) 16-bit elements each, row r at src + r * stride_bytes,
// zero elsewhere, as a 16x16 matrix of 32-bit elements S, and writes its transpose:
// dst[j * dst_stride + i] = S(i, j). Nothing past the named elements is read.
inline void transpose16_u32(const void* src, int64_t stride_bytes, int rows, int halves, uint32_t* dst,
                            int64_t dst_stride) {
  const __mmask32 mask = halves >= 32 ? 0xFFFFFFFFu : ((1u << halves) - 1u);
  __m512 t[16];
  for (int r = 0; r < 16; ++r)
    t[r] = r < rows ? _mm512_castsi512_ps(
                          _mm512_maskz_loadu_epi16(mask, static_cast<const char*>(src) + r * stride_bytes))
                    : _mm512_setzero_ps();
  transpose16(t);
  for (int j = 0; j < 16; ++j) _mm512_storeu_ps(dst + j * dst_stride, t[j]);
}

// The bfloat16 split of n float16 values (n a multiple of 16; 64-byte aligned): hi = x rounded to nearest even,
// lo = x - hi (exact), as gemm_amx_kernel.h defines them; a NaN gives a quiet NaN hi, and an infinity or NaN a
// zero lo.
inline void split_f16_to_bf16(const uint16_t* src, int64_t n, uint16_t* hi, uint16_t* lo) {
  const __m512i exp_mask = _mm512_set1_epi32(0x7F800000);
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 x = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(src + i)));
    // float16 inputs cannot round up to an infinity in bfloat16, and an infinity rounds to itself.
    const __m512i hi_bits = to_bf16_bits(x);
    const __mmask16 finite = _mm512_cmpneq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(x), exp_mask), exp_mask);
    const __m512 hi_wide = _mm512_castsi512_ps(_mm512_slli_epi32(hi_bits, 16));
    const __m512 rest = _mm512_maskz_sub_ps(finite, x, hi_wide);  // exact; zero where x is not finite
    const __m256i hi_halves = _mm512_cvtepi32_epi16(hi_bits);
    _mm256_store_si256(reinterpret_cast<__m256i*>(hi + i), hi_halves);
    _mm256_store_si256(reinterpret_cast<__m256i*>(lo + i),
                       _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(rest), 16)));
  }
}

}  // namespace shim
}  // namespace
}  // namespace mixtrain::kernels::cpu
