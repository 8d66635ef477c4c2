// Helpers shared by the AVX-512 GEMM translation units (gemm_avx512.cpp, gemm_avx512_bf16.cpp): masked
// loads and stores in any float dtype, a 16x16 register transpose, and the epilogue of a 12x32 tile.
// Include only from files compiled with -mavx512f/bw/vl/dq -mfma -mf16c. Everything here sits in an
// anonymous namespace, so each file gets its own internal copy and the linker never merges one compiled
// for AVX-512 into a file for a lower instruction set (see gemm_backend.h).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/gemm_backend.h"

namespace mixtrain::kernels::cpu {
namespace {

// The AVX-512 micro-tile: 12 rows x 32 columns of C (24 zmm accumulators).
constexpr int kAvx512MR = 12;
constexpr int kAvx512NR = 32;

// Local helpers rather than std::min: see gemm_backend.h on inline functions in ISA files.
inline int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }

// Mask of the first n of 16 lanes (n may be <= 0 or > 16).
inline __mmask16 first_lanes(int64_t n) {
  if (n <= 0) return 0;
  if (n >= 16) return 0xFFFF;
  return static_cast<__mmask16>((1u << n) - 1u);
}

constexpr int64_t element_size(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

// Loads the lanes of `mask` (up to 16 consecutive elements of dtype D) as float32, zero elsewhere.
// Masked-off lanes are not read, so a load at the end of a row cannot fault.
template <DType D>
inline __m512 load16(const void* p, __mmask16 mask) {
  if constexpr (D == DType::kFloat32) {
    return _mm512_maskz_loadu_ps(mask, p);
  } else if constexpr (D == DType::kFloat16) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p));
  } else {  // bfloat16 is the top half of a float32
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p)), 16));
  }
}

inline __m512 load16(const void* p, DType dtype, __mmask16 mask) {
  switch (dtype) {
    case DType::kFloat16:
      return load16<DType::kFloat16>(p, mask);
    case DType::kBFloat16:
      return load16<DType::kBFloat16>(p, mask);
    default:
      return load16<DType::kFloat32>(p, mask);
  }
}

// float32 -> bfloat16 bits (in the low half of each 32-bit lane), round to nearest even, NaN kept quiet.
// Integer arithmetic rather than vcvtneps2bf16, which flushes subnormals to zero.
inline __m512i to_bf16_bits(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF));  // ties go to the even neighbour
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000));
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_mask_mov_epi32(rounded, nan, quiet);
}

// Rounds once into dtype and stores the lanes of `mask`.
inline void store16(void* p, DType dtype, __m512 v, __mmask16 mask) {
  switch (dtype) {
    case DType::kFloat16:
      _mm256_mask_storeu_epi16(p, mask, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      break;
    case DType::kBFloat16:
      _mm256_mask_storeu_epi16(p, mask, _mm512_cvtepi32_epi16(to_bf16_bits(v)));
      break;
    default:
      _mm512_mask_storeu_ps(static_cast<float*>(p), mask, v);
  }
}

// 32 values rounded once into dtype (v0 the first 16) written with non-temporal stores to out, 64-byte aligned:
// whole cache lines, which need not be read in first. The rounding is store16's.
inline void stream_row32(void* out, DType dtype, __m512 v0, __m512 v1) {
  switch (dtype) {
    case DType::kFloat16:
      _mm512_stream_si512(static_cast<__m512i*>(out),
                          _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtps_ph(v0, _MM_FROUND_TO_NEAREST_INT |
                                                                                            _MM_FROUND_NO_EXC)),
                                             _mm512_cvtps_ph(v1, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), 1));
      break;
    case DType::kBFloat16:
      _mm512_stream_si512(static_cast<__m512i*>(out),
                          _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(to_bf16_bits(v0))),
                                             _mm512_cvtepi32_epi16(to_bf16_bits(v1)), 1));
      break;
    default:
      _mm512_stream_ps(static_cast<float*>(out), v0);
      _mm512_stream_ps(static_cast<float*>(out) + 16, v1);
  }
}

// In-place transpose of a 16x16 float32 block held in 16 registers (rows in, columns out).
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {  // interleave row pairs
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int q = 0; q < 4; ++q) {  // each 128-bit lane now holds 4 rows of one column
    r[4 * q + 0] = _mm512_shuffle_ps(t[4 * q], t[4 * q + 2], 0x44);
    r[4 * q + 1] = _mm512_shuffle_ps(t[4 * q], t[4 * q + 2], 0xEE);
    r[4 * q + 2] = _mm512_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0x44);
    r[4 * q + 3] = _mm512_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0xEE);
  }
  for (int c = 0; c < 4; ++c) {  // gather the four 128-bit lanes of each column
    const __m512 x = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44);
    const __m512 y = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xEE);
    const __m512 z = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44);
    const __m512 w = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xEE);
    t[c] = _mm512_shuffle_f32x4(x, z, 0x88);
    t[4 + c] = _mm512_shuffle_f32x4(x, z, 0xDD);
    t[8 + c] = _mm512_shuffle_f32x4(y, w, 0x88);
    t[12 + c] = _mm512_shuffle_f32x4(y, w, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// The C tile is read and written only after the k loop; fetching it before the loop hides the misses.
inline void prefetch_c_tile(int mr_used, const Epilogue& ep) {
  const int64_t add_size = element_size(ep.add_dtype), out_size = element_size(ep.out_dtype);
  for (int i = 0; i < mr_used; ++i) {
    const char* out_row = static_cast<const char*>(ep.out) + i * ep.ld_out * out_size;
    _mm_prefetch(out_row, _MM_HINT_T0);
    _mm_prefetch(out_row + 16 * out_size, _MM_HINT_T0);
    if (ep.add != nullptr && ep.add != ep.out) {
      const char* add_row = static_cast<const char*>(ep.add) + i * ep.ld_add * add_size;
      _mm_prefetch(add_row, _MM_HINT_T0);
      _mm_prefetch(add_row + 16 * add_size, _MM_HINT_T0);
    }
  }
}

// Epilogue of a (12, 32) float32 tile in memory (row stride 32, 64-byte aligned): out = alpha (tile + add) +
// bias, rounded once into out's dtype; masks cut the right edge of C.
inline void tile_epilogue(const float* tile, int mr_used, int nr_used, const Epilogue& ep) {
  constexpr int kNR = kAvx512NR;
  const int64_t add_size = element_size(ep.add_dtype), out_size = element_size(ep.out_dtype);
  const __mmask16 m0 = first_lanes(nr_used), m1 = first_lanes(nr_used - 16);
  // Whole rows of a large C whose rows start on cache lines: non-temporal stores (Epilogue::stream_out).
  const bool stream = ep.stream_out && nr_used == kNR &&
                      (reinterpret_cast<uintptr_t>(ep.out) | static_cast<uintptr_t>(ep.ld_out * out_size)) % 64 == 0;
  __m512 bias0 = _mm512_setzero_ps(), bias1 = _mm512_setzero_ps();
  if (ep.bias) {
    bias0 = _mm512_maskz_loadu_ps(m0, ep.bias);
    bias1 = _mm512_maskz_loadu_ps(m1, ep.bias + 16);
  }
  const __m512 alpha = _mm512_set1_ps(ep.alpha);
  for (int i = 0; i < mr_used; ++i) {
    __m512 v0 = _mm512_load_ps(tile + i * kNR), v1 = _mm512_load_ps(tile + i * kNR + 16);
    if (ep.add) {
      const char* row = static_cast<const char*>(ep.add) + i * ep.ld_add * add_size;
      v0 = _mm512_add_ps(v0, load16(row, ep.add_dtype, m0));
      v1 = _mm512_add_ps(v1, load16(row + 16 * add_size, ep.add_dtype, m1));
    }
    if (ep.alpha != 1.0f) {
      v0 = _mm512_mul_ps(v0, alpha);
      v1 = _mm512_mul_ps(v1, alpha);
    }
    if (ep.bias) {
      v0 = _mm512_add_ps(v0, bias0);
      v1 = _mm512_add_ps(v1, bias1);
    }
    char* out = static_cast<char*>(ep.out) + i * ep.ld_out * out_size;
    if (stream) {
      stream_row32(out, ep.out_dtype, v0, v1);
    } else {
      store16(out, ep.out_dtype, v0, m0);
      store16(out + 16 * out_size, ep.out_dtype, v1, m1);
    }
  }
}

// Writes the (12, 32) accumulator tile to L1 and runs the epilogue on it. The epilogue reads the tile
// from memory rather than registers: indexing the accumulators by the run-time row count would make
// the compiler keep them on the stack inside the k loop. Fully unrolled, so c stays in registers.
inline void finish_tile(const __m512 (&c)[kAvx512MR][2], int mr_used, int nr_used, const Epilogue& ep) {
  alignas(64) float tile[kAvx512MR * kAvx512NR];  // (MR, NR)
#pragma GCC unroll 12
  for (int i = 0; i < kAvx512MR; ++i) {
    _mm512_store_ps(tile + i * kAvx512NR, c[i][0]);
    _mm512_store_ps(tile + i * kAvx512NR + 16, c[i][1]);
  }
  tile_epilogue(tile, mr_used, nr_used, ep);
}

}  // namespace
}  // namespace mixtrain::kernels::cpu
