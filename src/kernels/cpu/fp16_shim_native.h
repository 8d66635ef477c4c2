// The instructions the AVX512-FP16 GEMM kernel (gemm_fp16_kernel.h) uses, as the real AVX512-FP16 and
// AVX-512 instructions; fp16_shim_emulated.h has the same functions in portable C++, so the same kernel
// source runs in the tests on every CPU. Include only from files compiled with -mavx512fp16
// -mavx512f/bw/vl/dq -mfma -mf16c; reach them only when cpu_features() reports AVX512-FP16.
#pragma once

#include <immintrin.h>

#include "kernels/cpu/gemm_avx512_common.h"
#include "kernels/cpu/pack_shim_native.h"

namespace mixtrain::kernels::cpu {
namespace {
namespace shim {

// 32 float16 lanes.
using VecH = __m512h;

inline VecH zero_h() { return _mm512_setzero_ph(); }
// 16 packed slots (32 float16 values), 64-byte aligned.
inline VecH load_h(const float* slots) { return _mm512_castps_ph(_mm512_load_ps(slots)); }
// One slot (a pair of float16 values) in all 16 slot positions.
inline VecH broadcast_pair(const float* slot) { return _mm512_castps_ph(_mm512_set1_ps(*slot)); }
// c + a * b in each lane, rounded once to float16 (vfmadd231ph).
inline VecH fma_h(VecH a, VecH b, VecH c) { return _mm512_fmadd_ph(a, b, c); }
// sum[l] += float(v[l]) for the 32 lanes (conversion exact, the add in float32).
inline void accumulate_f32(VecH v, float* sum) {
  const __m256h lo = _mm512_castph512_ph256(v);
  const __m256h hi = _mm256_castsi256_ph(_mm512_extracti64x4_epi64(_mm512_castph_si512(v), 1));
  _mm512_store_ps(sum, _mm512_add_ps(_mm512_load_ps(sum), _mm512_cvtxph_ps(lo)));
  _mm512_store_ps(sum + 16, _mm512_add_ps(_mm512_load_ps(sum + 16), _mm512_cvtxph_ps(hi)));
}

// The epilogue of a finished (12, 32) float32 tile in memory (row stride 32, 64-byte aligned).
inline void finish(const float* tile, int mr_used, int nr_used, const Epilogue& ep) {
  tile_epilogue(tile, mr_used, nr_used, ep);
}

inline void prefetch_c(int mr_used, const Epilogue& ep) { prefetch_c_tile(mr_used, ep); }

}  // namespace shim
}  // namespace
}  // namespace mixtrain::kernels::cpu
