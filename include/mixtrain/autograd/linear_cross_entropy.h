// A language model's output projection and sparse categorical cross-entropy as one differentiable function over
// chunks of rows (ops/linear_cross_entropy.h): the float32 logits of the whole batch never exist.
#pragma once

#include <cstdint>

#include "mixtrain/autograd/tape.h"

namespace mixtrain {

// The mean over the rows of x (..., D) of -log softmax(x kernel + bias)[label], a float32 scalar Var; labels (...)
// int32 or int64. kernel_compute is kernel in x's dtype (a layer's cached cast); bias undefined or float32 (V,).
// The gradients are made in the forward pass, for the upstream gradient `seed` (one float32 element on x's device:
// the loss scale times a micro-batch's share), so no logits are kept for backward: the backward pass of the result
// must be seeded with exactly seed (an Error says so where it can read the seed, on the CPU). Without a seed, or
// when nothing is recorded, only the loss is computed. correct: when not null, receives the rows whose arg-max is
// their label, a float32 (1,) tensor on x's device. chunk_rows: 0 for the op's default.
Var linear_cross_entropy(const Var& x, const Var& kernel, const Tensor& kernel_compute, const Var& bias,
                         const Tensor& labels, const Tensor& seed, int64_t chunk_rows = 0, Tensor* correct = nullptr);

}  // namespace mixtrain
