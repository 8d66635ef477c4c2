// The instructions the AVX512-FP16 GEMM kernel (gemm_fp16_kernel.h) uses, emulated in portable C++:
// the same functions as fp16_shim_native.h, so the same kernel source runs on any CPU. vfmadd231ph rounds
// c + a * b once to float16 (to nearest even, subnormals kept); the emulation computes a * b + c in
// float64 (a * b exactly; the add exactly unless the two differ by more than 2^29) and rounds that once
// to float16 with its own rounding (no float32 step, which could round twice). Slow; for the tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/gemm_backend.h"
#include "kernels/cpu/pack_shim_emulated.h"
#include "mixtrain/core/half.h"

namespace mixtrain::kernels::cpu {
namespace {
namespace shim {

struct VecH {
  float lane[32];  // float16 values, held exactly as float32
};

inline VecH zero_h() { return VecH{}; }
inline VecH load_h(const float* slots) {
  uint16_t bits[32];
  std::memcpy(bits, slots, sizeof(bits));
  VecH v;
  for (int l = 0; l < 32; ++l) v.lane[l] = half_bits_to_float(bits[l]);
  return v;
}
inline VecH broadcast_pair(const float* slot) {
  uint16_t bits[2];
  std::memcpy(bits, slot, sizeof(bits));
  VecH v;
  for (int l = 0; l < 32; ++l) v.lane[l] = half_bits_to_float(bits[l % 2]);
  return v;
}

// x rounded to the nearest float16 (ties to even), subnormals and overflow to infinity included.
inline float round_to_half(double x) {
  if (x == 0 || !std::isfinite(x)) return static_cast<float>(x);
  int e = 0;
  std::frexp(x, &e);                 // |x| in [2^(e-1), 2^e)
  const int q = e - 11 > -24 ? e - 11 : -24;  // exponent of a float16 ulp at x (2^-24 for subnormals)
  const double y = std::ldexp(std::nearbyint(std::ldexp(x, -q)), q);
  return std::fabs(y) > 65504.0 ? static_cast<float>(std::copysign(INFINITY, x)) : static_cast<float>(y);
}

inline VecH fma_h(const VecH& a, const VecH& b, const VecH& c) {
  VecH r;
  for (int l = 0; l < 32; ++l)
    r.lane[l] = round_to_half(static_cast<double>(a.lane[l]) * b.lane[l] + static_cast<double>(c.lane[l]));
  return r;
}
inline void accumulate_f32(const VecH& v, float* sum) {
  for (int l = 0; l < 32; ++l) sum[l] += v.lane[l];
}

inline void finish(const float* tile, int mr_used, int nr_used, const Epilogue& ep) {
  scalar_epilogue(tile, 32, mr_used, nr_used, ep);
}

inline void prefetch_c(int, const Epilogue&) {}

}  // namespace shim
}  // namespace
}  // namespace mixtrain::kernels::cpu
