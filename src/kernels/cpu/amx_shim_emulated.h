// The instructions the AMX-BF16 GEMM kernel (gemm_amx_kernel.h) uses, emulated in portable C++ with the
// semantics the Intel SDM gives them: same functions as amx_shim_native.h, so the same kernel source runs
// on any CPU. Slow (a scalar loop per tile product); for the tests, never chosen for speed.
//
// tdpbf16ps as emulated here: bfloat16 inputs that are subnormal read as zero (DAZ); for each pair, the two
// exact products are added to the float32 accumulator one after the other, each add rounded to nearest
// even with a subnormal result flushed to zero (FTZ), as the SDM's pseudocode writes it. The hardware
// keeps the order and width of its internal adds to itself: on a Sapphire Rapids core, 1 + 2^-24 + 2^-24
// over two pairs gives 1 + 2^-23 (the pseudocode's order gives 1), so bits differ in the last place.
// Both are float32 sums of the same exact products, within the same error bound, which the tests check
// on each.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/gemm_backend.h"
#include "mixtrain/core/half.h"
#include "kernels/cpu/pack_shim_emulated.h"

namespace mixtrain::kernels::cpu {
namespace {
namespace shim {

constexpr bool kEmulated = true;

// Eight tile registers of 16 rows x 64 bytes, per thread like the real ones.
struct Tiles {
  alignas(64) unsigned char reg[8][16][64];
};
thread_local Tiles t_tiles;

inline void configure_tiles() { std::memset(&t_tiles, 0, sizeof(t_tiles)); }
inline void release_tiles() {}

template <int T>
inline void tile_zero() {
  std::memset(t_tiles.reg[T], 0, sizeof(t_tiles.reg[T]));
}
template <int T>
inline void tile_load(const void* base, int64_t stride_bytes) {
  for (int r = 0; r < 16; ++r) std::memcpy(t_tiles.reg[T][r], static_cast<const char*>(base) + r * stride_bytes, 64);
}
// The same load; the hint (amx_shim_native.h) changes where the data is cached, not the tile.
template <int T>
inline void tile_stream_load(const void* base, int64_t stride_bytes) {
  tile_load<T>(base, stride_bytes);
}
template <int T>
inline void tile_store(void* base, int64_t stride_bytes) {
  for (int r = 0; r < 16; ++r) std::memcpy(static_cast<char*>(base) + r * stride_bytes, t_tiles.reg[T][r], 64);
}

// A bfloat16 as float32, a subnormal read as a zero of the same sign.
inline float bf16_daz(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  return bits_float((u & 0x7F800000u) == 0 ? (u & 0x80000000u) : u);
}
inline float flush_subnormal(float f) {
  const uint32_t u = float_bits(f);
  return (u & 0x7F800000u) == 0 ? bits_float(u & 0x80000000u) : f;
}

template <int C, int A, int B>
inline void tile_dpbf16ps() {
  for (int m = 0; m < 16; ++m) {
    float acc[16];
    std::memcpy(acc, t_tiles.reg[C][m], 64);
    uint16_t a[32];
    std::memcpy(a, t_tiles.reg[A][m], 64);
    for (int k = 0; k < 16; ++k) {
      uint16_t b[32];
      std::memcpy(b, t_tiles.reg[B][k], 64);
      const float a0 = bf16_daz(a[2 * k]), a1 = bf16_daz(a[2 * k + 1]);
      for (int n = 0; n < 16; ++n) {
        acc[n] = flush_subnormal(acc[n] + a0 * bf16_daz(b[2 * n]));
        acc[n] = flush_subnormal(acc[n] + a1 * bf16_daz(b[2 * n + 1]));
      }
    }
    std::memcpy(t_tiles.reg[C][m], acc, 64);
  }
}

inline void finish(const float* tile, int mr_used, int nr_used, const Epilogue& ep) {
  scalar_epilogue(tile, 32, mr_used, nr_used, ep);
}

// Writes a finished (32, 32) float32 tile in memory (row stride 32) to rows of out, ld apart (non-temporal stores in
// the real shim; plain copies here).
inline void stream_tile(const float* tile, void* out, int64_t ld) {
  for (int i = 0; i < 32; ++i) std::memcpy(static_cast<float*>(out) + i * ld, tile + i * 32, 128);
}

inline void prefetch_c(int, const Epilogue&) {}

}  // namespace shim
}  // namespace
}  // namespace mixtrain::kernels::cpu
