// The instructions the AMX-BF16 GEMM kernel (gemm_amx_kernel.h) uses, as the real AMX and AVX-512
// instructions. amx_shim_emulated.h has the same functions in portable C++; the kernel is compiled once
// against each, so its packing, blocking and edges run in the tests on every CPU.
//
// Include only from files compiled with -mamx-tile -mamx-bf16 -mavx512f/bw/vl/dq/bf16 -mfma -mf16c, and reach
// them only when cpu_features() reports AMX-BF16, AVX512_BF16 and the AVX-512 path and the OS granted the tile state.
// Everything sits in an anonymous namespace (see gemm_backend.h on inline functions in ISA files).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/gemm_avx512_common.h"
#include "kernels/cpu/pack_shim_native.h"

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
// tileloaddt1: the same load with a hint that the data will not be read again soon, so it is not kept in L1 (the
// caller streams this operand from L2 and keeps the other in L1).
template <int T>
inline void tile_stream_load(const void* base, int64_t stride_bytes) {
#define MIXTRAIN_AMX_OP(t) _tile_stream_loadd(t, base, stride_bytes)
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

// Whether rows of out, ld elements of `size` bytes apart, all start on a cache line.
inline bool lines_aligned(const void* out, int64_t ld, int64_t size) {
  return (reinterpret_cast<uintptr_t>(out) | static_cast<uintptr_t>(ld * size)) % 64 == 0;
}

// A finished (32, 32) float32 tile in L1 (row stride 32) to float32 rows of out, ld apart, with non-temporal
// stores where they are whole aligned lines. A tile store straight into a C larger than the caches reads each
// line in before overwriting it; at 64 MiB of weight gradient that doubled the memory traffic and ran the product
// at a third of its speed.
inline void stream_tile(const float* tile, void* out, int64_t ld) {
  const bool aligned = lines_aligned(out, ld, 4);
  for (int i = 0; i < 32; ++i) {
    float* row = static_cast<float*>(out) + i * ld;
    const __m512 v0 = _mm512_load_ps(tile + i * 32), v1 = _mm512_load_ps(tile + i * 32 + 16);
    if (aligned) {
      _mm512_stream_ps(row, v0);
      _mm512_stream_ps(row + 16, v1);
    } else {
      _mm512_storeu_ps(row, v0);
      _mm512_storeu_ps(row + 16, v1);
    }
  }
}

// Two vectors of float32 rounded to 32 bfloat16 (lo's lanes first), with to_bf16_bits' bits. vcvtne2ps2bf16 rounds to
// nearest even and quiets a NaN as to_bf16_bits does, but reads a subnormal input as zero; a pair with a subnormal
// lane (only where a bias or an added C made one: tile sums are never subnormal) takes to_bf16_bits.
inline __m512i to_bf16_pair(__m512 lo, __m512 hi) {
  const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF), smallest_normal = _mm512_set1_epi32(0x00800000);
  const __m512i m0 = _mm512_and_si512(_mm512_castps_si512(lo), magnitude);
  const __m512i m1 = _mm512_and_si512(_mm512_castps_si512(hi), magnitude);
  const __mmask16 sub0 = _mm512_mask_cmplt_epu32_mask(_mm512_test_epi32_mask(m0, m0), m0, smallest_normal);
  const __mmask16 sub1 = _mm512_mask_cmplt_epu32_mask(_mm512_test_epi32_mask(m1, m1), m1, smallest_normal);
  if ((sub0 | sub1) == 0) return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(to_bf16_bits(lo))),
                            _mm512_cvtepi32_epi16(to_bf16_bits(hi)), 1);
}

// The epilogue of a finished float32 tile (mr, nr <= 32) in memory with row stride ld (64-byte aligned): the AVX-512
// path's, except that a bfloat16 C with all 32 columns is written a whole 64-byte row at a time (two masked
// narrowing stores a row were a tenth of the bfloat16 GEMM's time at n = 1024).
inline void finish(const float* tile, int mr_used, int nr_used, const Epilogue& ep) {
  if (ep.out_dtype != DType::kBFloat16 || nr_used != 32) return tile_epilogue(tile, mr_used, nr_used, ep);
  const int64_t add_size = element_size(ep.add_dtype);
  const __m512 bias0 = ep.bias ? _mm512_loadu_ps(ep.bias) : _mm512_setzero_ps();
  const __m512 bias1 = ep.bias ? _mm512_loadu_ps(ep.bias + 16) : _mm512_setzero_ps();
  const bool stream = ep.stream_out && lines_aligned(ep.out, ep.ld_out, 2);
  const __m512 alpha = _mm512_set1_ps(ep.alpha);
  for (int i = 0; i < mr_used; ++i) {
    __m512 v0 = _mm512_load_ps(tile + i * 32), v1 = _mm512_load_ps(tile + i * 32 + 16);
    if (ep.add) {  // the same operations, in the same order, as tile_epilogue
      const char* row = static_cast<const char*>(ep.add) + i * ep.ld_add * add_size;
      v0 = _mm512_add_ps(v0, load16(row, ep.add_dtype, 0xFFFF));
      v1 = _mm512_add_ps(v1, load16(row + 16 * add_size, ep.add_dtype, 0xFFFF));
    }
    if (ep.alpha != 1.0f) {
      v0 = _mm512_mul_ps(v0, alpha);
      v1 = _mm512_mul_ps(v1, alpha);
    }
    if (ep.bias) {
      v0 = _mm512_add_ps(v0, bias0);
      v1 = _mm512_add_ps(v1, bias1);
    }
    char* out = static_cast<char*>(ep.out) + i * ep.ld_out * 2;
    if (stream) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(out), to_bf16_pair(v0, v1));
    } else {
      _mm512_storeu_si512(out, to_bf16_pair(v0, v1));
    }
  }
}

inline void prefetch_c(int mr_used, const Epilogue& ep) { prefetch_c_tile(mr_used, ep); }

}  // namespace shim
}  // namespace
}  // namespace mixtrain::kernels::cpu
