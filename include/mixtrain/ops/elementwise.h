// Elementwise operations, forward and backward side by side. Each reads its inputs as float32,
// computes in float32 and rounds the result once into the output's dtype (the input's), so a float16
// activation costs float16 memory but float32 arithmetic. Every op takes tensors of any rank; views are
// made contiguous before the kernel runs.
#pragma once

#include <string_view>
#include <vector>

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

enum class Activation { kLinear, kRelu, kGelu, kSigmoid, kTanh };
// "linear" (also "" and "none"), "relu", "gelu", "sigmoid", "tanh"; Error listing them otherwise.
Activation parse_activation(std::string_view name);
const char* activation_name(Activation a);

// y = f(x), same shape and dtype as x.
Tensor activation(const Tensor& x, Activation a);
// x = f(x) over x itself (contiguous, floating): activation's values without a second tensor of x's size, for an
// output computed without gradients (as a GEMM's epilogue applies the activation where it writes).
void activation_in_place(Tensor& x, Activation a);
// dx = dy * f'(x), from the saved input x (relu, gelu; gelu is exact, with erf, as Keras' default) or the
// saved output y (sigmoid, tanh). dx has dy's dtype (x's for the linear activation).
Tensor activation_backward(const Tensor& dy, const Tensor& x, const Tensor& y, Activation a);

// a + b, same shape (any rank); result in a's dtype.
Tensor add(const Tensor& a, const Tensor& b);
// acc += g in place: acc a contiguous floating tensor, g of the same shape in any floating dtype; each sum is
// computed in float32 and rounded once into acc's dtype (how gradients accumulate into a variable's buffer).
void add_into(Tensor& acc, const Tensor& g);
// a * s for a float32 scalar s; result in a's dtype.
Tensor scale(const Tensor& a, float s);
// x *= s in place, x a contiguous floating tensor: scale's values without a second buffer of x's size (how a
// data-parallel step weights its gradient buffer before the all-reduce).
void scale_in_place(Tensor& x, float s);
// x + bias broadcast over the last axis: x (..., n), bias (n,) of any floating dtype; result in x's dtype.
Tensor bias_add(const Tensor& x, const Tensor& bias);
// Sum of dy (..., n) over every axis but the last -> (n,) float32: the gradient of bias_add for the bias.
Tensor sum_rows(const Tensor& dy);

// Inverted dropout: keeps each element with probability 1 - rate and scales kept ones by 1 / (1 - rate).
// mask is a uint8 tensor (1 keep, 0 drop) with x's element count, drawn by the caller, so the same seed
// gives the same masks.
Tensor dropout(const Tensor& x, const Tensor& mask, float rate);
Tensor dropout_backward(const Tensor& dy, const Tensor& mask, float rate);
// Such a mask of `shape` on `device`, drawn there: element i (row-major) is kept when the 24-bit uniform of a hash of
// (seed, i) is >= rate, the hash attention's dropout draws from (ops::attention_dropout_keep). The same seed gives
// the same mask on every device, and a training step on a GPU draws its masks without the host.
Tensor dropout_mask(const Shape& shape, float rate, uint64_t seed, const Device& device);

// The library's one finite check. Number of inf or NaN elements of x, read in float32 (0 for integer
// tensors, which cannot hold either).
int64_t count_nonfinite(const Tensor& x);
// Whether every defined floating tensor in xs is free of inf and NaN (stops at the first that is not).
bool all_finite(const std::vector<Tensor>& xs);
// Sets every element of a contiguous floating tensor to value (rounded once into its dtype), on its device.
void fill(Tensor& y, float value);
// A new floating tensor of value on device (Tensor::zeros / Tensor::full on any device).
Tensor full(const Shape& shape, DType dtype, float value, const Device& device);

// The kernels behind these ops (dispatch.h). Inputs are contiguous and validated, outputs preallocated.
namespace kernel {
// y = f(x); x and y share shape and dtype.
using ActivationFn = void(const Tensor& x, Activation a, Tensor& y);
// dx = dy * f'(saved), saved being x (relu, gelu) or y (sigmoid, tanh); dx has dy's shape and dtype.
using ActivationBackwardFn = void(const Tensor& dy, const Tensor& saved, Activation a, Tensor& dx);
// y = a + b; same shape, y has a's dtype.
using AddFn = void(const Tensor& a, const Tensor& b, Tensor& y);
// y = x * s.
using ScaleFn = void(const Tensor& x, float s, Tensor& y);
// y (rows, n) = x (rows, n) + bias (n,); x and y are read as rows of bias.numel() elements.
using BiasAddFn = void(const Tensor& x, const Tensor& bias, Tensor& y);
// out (n,) float32 = sum over rows of dy (rows, n), n = out.numel().
using SumRowsFn = void(const Tensor& dy, Tensor& out);
// y = mask ? x * keep_scale : 0.
using DropoutFn = void(const Tensor& x, const Tensor& mask, float keep_scale, Tensor& y);
// mask (uint8, contiguous): 1 where dropout_keep(seed, i, rate), else 0.
using DropoutMaskFn = void(float rate, uint64_t seed, Tensor& mask);
// Number of inf or NaN elements of a floating tensor.
using CountNonfiniteFn = int64_t(const Tensor& x);
// Sets every element of y to value (rounded once into y's dtype).
using FillFn = void(Tensor& y, float value);
}  // namespace kernel
MIXTRAIN_KERNEL_SIGNATURE(activation, ActivationFn)
MIXTRAIN_KERNEL_SIGNATURE(activation_backward, ActivationBackwardFn)
MIXTRAIN_KERNEL_SIGNATURE(add, AddFn)
MIXTRAIN_KERNEL_SIGNATURE(scale, ScaleFn)
MIXTRAIN_KERNEL_SIGNATURE(bias_add, BiasAddFn)
MIXTRAIN_KERNEL_SIGNATURE(sum_rows, SumRowsFn)
MIXTRAIN_KERNEL_SIGNATURE(dropout, DropoutFn)
MIXTRAIN_KERNEL_SIGNATURE(dropout_mask, DropoutMaskFn)
MIXTRAIN_KERNEL_SIGNATURE(count_nonfinite, CountNonfiniteFn)
MIXTRAIN_KERNEL_SIGNATURE(fill, FillFn)

}  // namespace mixtrain::ops
