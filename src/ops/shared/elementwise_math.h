// The element steps of the elementwise ops (ops/elementwise.h) on one float32 value, for the GPU kernels, in the
// CPU kernels' order (cpu/elementwise.cpp). relu, GELU and the products give the CPU's bits on either device;
// sigmoid and tanh call exp and tanh, which differ between glibc and CUDA in the last place or two.
#pragma once

#include <cstdint>

#include "gelu_math.h"
#include "host_device.h"
#include "mixtrain/ops/elementwise.h"

namespace mixtrain::ops::shared {

// NaN passes through relu (NaN < 0 is false), so a poisoned input is never hidden.
MIXTRAIN_HOST_DEVICE inline float relu(float v) { return v < 0.0f ? 0.0f : v; }

// Split by sign so that exp never overflows.
MIXTRAIN_HOST_DEVICE inline float sigmoid(float v) {
  if (v >= 0) return div_rn(1.0f, add_rn(1.0f, exp_f32(-v)));
  const float e = exp_f32(v);
  return div_rn(e, add_rn(1.0f, e));
}

// y = f(v).
MIXTRAIN_HOST_DEVICE inline float activation_value(Activation a, float v) {
  switch (a) {
    case Activation::kRelu: return relu(v);
    case Activation::kGelu: return gelu_math::gelu(v);
    case Activation::kSigmoid: return sigmoid(v);
    case Activation::kTanh: return tanh_f32(v);
    case Activation::kLinear: break;
  }
  return v;
}

// dx = d * f'(.), from the saved input (relu, gelu) or the saved output s (sigmoid, tanh).
MIXTRAIN_HOST_DEVICE inline float activation_grad(Activation a, float d, float s) {
  switch (a) {
    case Activation::kRelu: return s > 0 ? d : 0.0f;
    case Activation::kGelu: return mul_rn(d, gelu_math::gelu_derivative(s));
    case Activation::kSigmoid: return mul_rn(mul_rn(d, s), sub_rn(1.0f, s));
    case Activation::kTanh: return mul_rn(d, sub_rn(1.0f, mul_rn(s, s)));
    case Activation::kLinear: break;
  }
  return d;
}

// Inverted dropout: a kept element scaled by keep_scale = 1 / (1 - rate), a dropped one zero.
MIXTRAIN_HOST_DEVICE inline float dropout_value(float v, uint8_t keep, float keep_scale) {
  return keep ? mul_rn(v, keep_scale) : 0.0f;
}

MIXTRAIN_HOST_DEVICE inline bool is_nonfinite(float v) { return !float_is_finite(v); }

}  // namespace mixtrain::ops::shared
