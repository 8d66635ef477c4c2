// Elementwise operations, forward and backward side by side. Each reads its inputs as float32,
// computes in float32 and rounds the result once into the input's dtype, so a float16 activation
// costs float16 memory but float32 arithmetic.
#pragma once

#include <string_view>

#include "mixtrain/core/tensor.h"

namespace mixtrain::ops {

enum class Activation { kLinear, kRelu, kGelu, kSigmoid, kTanh };
// "linear" (also "" and "none"), "relu", "gelu", "sigmoid", "tanh"; Error listing them otherwise.
Activation parse_activation(std::string_view name);
const char* activation_name(Activation a);

// y = f(x), same shape and dtype as x.
Tensor activation(const Tensor& x, Activation a);
// dx = dy * f'(x), from the saved input x (gelu is exact, with erf, as Keras' default).
Tensor activation_backward(const Tensor& dy, const Tensor& x, const Tensor& y, Activation a);

// a + b, same shape; result in a's dtype.
Tensor add(const Tensor& a, const Tensor& b);
// a * s for a float32 scalar s; result in a's dtype.
Tensor scale(const Tensor& a, float s);
// x + bias broadcast over rows: x (B, n), bias (n,).
Tensor bias_add(const Tensor& x, const Tensor& bias);
// Sum over rows of dy (B, n) -> (n,) float32: the gradient of bias_add for the bias.
Tensor sum_rows(const Tensor& dy);

// Inverted dropout: keeps each element with probability 1 - rate and scales kept ones by 1 / (1 - rate).
// mask is a uint8 tensor (1 keep, 0 drop) drawn by the caller, so the same seed gives the same masks.
Tensor dropout(const Tensor& x, const Tensor& mask, float rate);
Tensor dropout_backward(const Tensor& dy, const Tensor& mask, float rate);

// Counts of non-finite elements, read in float32.
int64_t count_nonfinite(const Tensor& x);

}  // namespace mixtrain::ops
