// What the shared arithmetic (this folder) needs to be one source for the CPU and the GPU: the host-and-device
// marker, float bit access, and float32 operations that round exactly once on both. Host code is plain C++;
// nvcc compiles the same functions for the device.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "mixtrain/core/half.h"
#include "mixtrain/core/host_device.h"

namespace mixtrain::ops::shared {

// core/half.h's bit access, compiled for the device too.
MIXTRAIN_HOST_DEVICE inline uint32_t bits_of(float v) { return float_bits(v); }
MIXTRAIN_HOST_DEVICE inline float float_of(uint32_t u) { return bits_float(u); }

// nvcc fuses a * b + c into one FMA by default (one rounding instead of two), which changes bits against the
// CPU; these forms are never fused. The host side relies on the CPU build not contracting either: src/ops and
// src/optim are built with -ffp-contract=off (and baseline x86-64 has no FMA anyway).
MIXTRAIN_HOST_DEVICE inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
MIXTRAIN_HOST_DEVICE inline float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
MIXTRAIN_HOST_DEVICE inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
MIXTRAIN_HOST_DEVICE inline float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
// double operations that round exactly once on both sides (nvcc would fuse a * b + c into an FMA).
MIXTRAIN_HOST_DEVICE inline double dadd_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
MIXTRAIN_HOST_DEVICE inline double dmul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
MIXTRAIN_HOST_DEVICE inline double ddiv_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

// a * b + c rounded once, on purpose (the host's std::fma is exact in software where the CPU has no FMA).
MIXTRAIN_HOST_DEVICE inline float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

MIXTRAIN_HOST_DEVICE inline float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// exp, log and tanh in float32. Not correctly rounded on either side (glibc's expf and CUDA's expf may differ in the
// last place), so ops using them match the CPU within a few units, not bit for bit, on the GPU.
MIXTRAIN_HOST_DEVICE inline float exp_f32(float x) {
#if defined(__CUDA_ARCH__)
  return ::expf(x);
#else
  return std::exp(x);
#endif
}
MIXTRAIN_HOST_DEVICE inline float log_f32(float x) {
#if defined(__CUDA_ARCH__)
  return ::logf(x);
#else
  return std::log(x);
#endif
}

MIXTRAIN_HOST_DEVICE inline float tanh_f32(float x) {
#if defined(__CUDA_ARCH__)
  return ::tanhf(x);
#else
  return std::tanh(x);
#endif
}

MIXTRAIN_HOST_DEVICE inline bool is_nan_f32(float x) {
#if defined(__CUDA_ARCH__)
  return ::isnan(x);
#else
  return std::isnan(x);
#endif
}

// Whether v is finite: inf and NaN are the float32 values with every exponent bit set (a 16-bit value widened keeps
// its class).
MIXTRAIN_HOST_DEVICE inline bool float_is_finite(float v) { return (bits_of(v) & 0x7F800000u) != 0x7F800000u; }

// std::max's rule (the first argument unless the second is larger): a NaN element never replaces a number. Which
// zero a row's maximum keeps depends on the order the row is read in (a warp's lanes may even hold both), and no
// output depends on it: see CudaSharedMath.AZeroRowMaximumGivesTheCpusOutputsWhicheverZeroEachLaneKeeps.
MIXTRAIN_HOST_DEVICE inline float max_f32(float a, float b) { return a < b ? b : a; }

}  // namespace mixtrain::ops::shared
