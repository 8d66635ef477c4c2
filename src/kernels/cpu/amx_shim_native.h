// The instructions the AMX-BF16 GEMM kernel (gemm_amx_kernel.h) uses, as the real AMX and AVX-512
// instructions. amx_shim_emulated.h has the same functions in portable C++; the kernel is compiled once
// against each, so its packing, blocking and edges run in the tests on every CPU.
//
// Include only from files compiled with -mamx-tile -mamx-bf16 -mavx512f/bw/vl/dq -mfma -mf16c, and reach
// them only when cpu_features() reports AMX-BF16 and the AVX-512 path and the OS granted the tile state.
// Everything sits in an anonymous namespace (see gemm_backend.h on inline functions in ISA files).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/gemm_avx512_common.h"

namespace mixtrain::kernels::cpu {
namespace {
namespace shim {

constexpr bool kEmulated = false;

// The tile configuration every kernel here uses: palette 1, all eight tiles 16 rows x 64 bytes
// (a 16x32 bfloat16 operand, a 16 pair-row x 16 column bfloat16 operand, or a 16x16 float32 accumulator).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

constexpr TileConfig make_tile_config() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  return config;
}

// A constant in memory rather than a local: GCC 12 does not see that ldtilecfg reads all 64 bytes and
// drops the stores of a local's rows and columns as dead.
alignas(64) constexpr TileConfig kTileConfig = make_tile_config();

inline void configure_tiles() { _tile_loadconfig(&kTileConfig); }

// Returns the tile state to its initial state, so the OS need not save 8 KiB of tiles on a context switch.
inline void release_tiles() { _tile_release(); }

// GCC's tile intrinsics are macros that paste the tile number into the assembly, so each tile number
// must be a literal: one branch per tile, chosen at compile time.
#define MIXTRAIN_AMX_TILE_CASES(OP) \
  if constexpr (T == 0) OP(0);      \
  else if constexpr (T == 1) OP(1); \
  else if constexpr (T == 2) OP(2); \
  else if constexpr (T == 3) OP(3); \
  else if constexpr (T == 4) OP(4); \
  else if constexpr (T == 5) OP(5); \
  else if constexpr (T == 6) OP(6); \
  else OP(7)

template <int T>
inline void tile_zero() {
#define MIXTRAIN_AMX_OP(t) _tile_zero(t)
  MIXTRAIN_AMX_TILE_CASES(MIXTRAIN_AMX_OP);
#undef MIXTRAIN_AMX_OP
}
template <int T>
inline void tile_load(const void* base, int64_t stride_bytes) {
#define MIXTRAIN_AMX_OP(t) _tile_loadd(t, base, stride_bytes)
  MIXTRAIN_AMX_TILE_CASES(MIXTRAIN_AMX_OP);
#undef MIXTRAIN_AMX_OP
}
template <int T>
inline void tile_store(void* base, int64_t stride_bytes) {
#define MIXTRAIN_AMX_OP(t) _tile_stored(t, base, stride_bytes)
  MIXTRAIN_AMX_TILE_CASES(MIXTRAIN_AMX_OP);
#undef MIXTRAIN_AMX_OP
}
#undef MIXTRAIN_AMX_TILE_CASES

// C (16x16 float32) += A (16 rows x 16 bfloat16 pairs) . B (16 pair-rows x 16 columns of pairs). The
// kernel uses accumulators 0..3, A tiles 4, 5 and B tiles 6, 7.
template <int C, int A, int B>
inline void tile_dpbf16ps() {
  static_assert((C == 0 && A == 4 && B == 6) || (C == 1 && A == 4 && B == 7) || (C == 2 && A == 5 && B == 6) ||
                (C == 3 && A == 5 && B == 7));
#define MIXTRAIN_AMX_DP(c, a, b) \
  if constexpr (C == c && A == a && B == b) _tile_dpbf16ps(c, a, b)
  MIXTRAIN_AMX_DP(0, 4, 6);
  MIXTRAIN_AMX_DP(1, 4, 7);
  MIXTRAIN_AMX_DP(2, 5, 6);
  MIXTRAIN_AMX_DP(3, 5, 7);
#undef MIXTRAIN_AMX_DP
}

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

// The epilogue of a finished float32 tile (mr, nr <= 32) in memory with row stride ld (64-byte aligned).
inline void finish(const float* tile, int mr_used, int nr_used, const Epilogue& ep) {
  tile_epilogue(tile, mr_used, nr_used, ep);  // the AVX-512 path's, for tiles 32 wide
}

inline void prefetch_c(int mr_used, const Epilogue& ep) { prefetch_c_tile(mr_used, ep); }

}  // namespace shim
}  // namespace
}  // namespace mixtrain::kernels::cpu
