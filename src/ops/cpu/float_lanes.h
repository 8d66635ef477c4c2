// Reading and writing float32, float16 and bfloat16 elements as float32 inside the CPU kernels' own loops,
// so a kernel computes on one small block at a time instead of converting whole rows into scratch first.
// float32 is read and written in place, with no copy; float16 and bfloat16 go through convert_elements (F16C
// and AVX-512 conversion) a block at a time, into buffers small enough to stay in L1. Every value is still
// computed in float32 and rounded once.
#pragma once

#include <cstdint>
#include <cstring>

#include "mixtrain/core/half.h"
#include "mixtrain/core/tensor.h"

// An AVX2 clone of a kernel's block function, chosen at load time (as Adam's update): its float32 loops
// run 8 lanes wide. No AVX-512 clone: GCC contracts a * b + c into an FMA under avx512f (its EVEX FMAs
// come with it), which would change the bits; AVX2 without FMA computes exactly what the scalar code does.
#define MIXTRAIN_CPU_CLONES __attribute__((target_clones("avx2", "default")))

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
