// Reading and writing float32, float16 and bfloat16 elements as float32 inside the CPU kernels' own loops,
// so a kernel computes on one small block at a time instead of converting whole rows into scratch first.
// float32 is read and written in place, with no copy; float16 and bfloat16 go through convert_elements (F16C
// and AVX-512 conversion) a block at a time, into buffers small enough to stay in L1. Every value is still
// computed in float32 and rounded once.
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>

#include "mixtrain/core/half.h"
#include "mixtrain/core/isa_level.h"
#include "mixtrain/core/tensor.h"

// A kernel's block function compiled twice, for the x86-64 baseline and for AVX2 (its float32 loops 8 lanes
// wide), and called through the one core's for_isa_level picks at the shared instruction-set level, so
// MIXTRAIN_ISA and the tests' override choose it as they choose the GEMM, the conversions and the optimizer
// passes. Write the function as `name_body` (always inline, so each wrapper compiles it for its own target),
// then MIXTRAIN_CPU_VARIANTS(name) defines `name` with the same arguments. No AVX-512 variant: GCC contracts
// a * b + c into an FMA under avx512f, which would change the bits; AVX2 without FMA computes exactly what the
// baseline code does, so every level gives the same results.
#define MIXTRAIN_CPU_BODY __attribute__((always_inline)) inline
#define MIXTRAIN_CPU_VARIANTS(name)                                              \
  template <class... Args>                                                       \
  __attribute__((target("avx2"))) void name##_avx2(Args&&... args) {             \
    name##_body(std::forward<Args>(args)...);                                    \
  }                                                                              \
  template <class... Args>                                                       \
  void name##_baseline(Args&&... args) {                                         \
    name##_body(std::forward<Args>(args)...);                                    \
  }                                                                              \
  template <class... Args>                                                       \
  void name(Args&&... args) {                                                    \
    ::mixtrain::for_isa_level(&name##_baseline<Args...>, &name##_avx2<Args...>,  \
                              &name##_avx2<Args...>)(std::forward<Args>(args)...); \
  }

namespace mixtrain::ops::cpu::lanes {

// n elements at p as float32: p itself for float32, else widened into buf.
inline const float* read(const float* p, int64_t, float*) { return p; }
inline const float* read(const bfloat16* p, int64_t n, float* buf) {
  convert_elements(p, DType::kBFloat16, buf, DType::kFloat32, n);
  return buf;
}
inline const float* read(const float16* p, int64_t n, float* buf) {
  convert_elements(p, DType::kFloat16, buf, DType::kFloat32, n);
  return buf;
}

// Where to compute n float32 results destined for p: p itself for float32, else buf (then write them).
inline float* out(float* p, float*) { return p; }
template <typename T>
float* out(T*, float* buf) {
  return buf;
}

// Stores n float32 values v (from out()) at p, rounded once into p's dtype.
inline void write(const float*, int64_t, float*) {}  // already in place
inline void write(const float* v, int64_t n, bfloat16* p) {
  convert_elements(v, DType::kFloat32, p, DType::kBFloat16, n);
}
inline void write(const float* v, int64_t n, float16* p) {
  convert_elements(v, DType::kFloat32, p, DType::kFloat16, n);
}

}  // namespace mixtrain::ops::cpu::lanes
