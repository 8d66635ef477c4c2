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

// The epilogue of a finished float32 tile (mr, nr <= 32) in memory with row stride ld (64-byte aligned).
inline void finish(const float* tile, int mr_used, int nr_used, const Epilogue& ep) {
  tile_epilogue(tile, mr_used, nr_used, ep);  // the AVX-512 path's, for tiles 32 wide
}

inline void prefetch_c(int mr_used, const Epilogue& ep) { prefetch_c_tile(mr_used, ep); }

}  // namespace shim
}  // namespace
}  // namespace mixtrain::kernels::cpu
