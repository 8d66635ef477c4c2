// Losses and reductions, forward and backward side by side. All accumulate and return float32
// whatever the input dtype (a float16 sum of a batch of losses overflows or loses the small terms);
// gradients come back in the input's dtype.
#pragma once

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

// Mean over rows of -log p(label). logits_or_probs (B, C) any float dtype; labels (B,) int32 or int64 in [0, C).
// Predictions of higher rank (B, T, C) take labels (B, T): every axis but the last indexes rows, so the loss
// is the mean per position (per token of a sequence model), as Keras computes it. So does the accuracy.
// from_logits: inputs are logits (log-softmax inside); else probabilities, clipped to [1e-7, 1 - 1e-7] as Keras does.
// Returns a float32 scalar (shape ()).
Tensor sparse_categorical_crossentropy(const Tensor& logits_or_probs, const Tensor& labels, bool from_logits);
// Gradient for the inputs, scaled by dloss (the upstream gradient of the scalar loss). Each backward also takes
// dloss as a one-element float32 tensor on the inputs' device, read there by the kernel: a backward pass seeded on
// a GPU (a loss scale kept there) never waits to read its seed on the host.
Tensor sparse_categorical_crossentropy_backward(const Tensor& logits_or_probs, const Tensor& labels, bool from_logits,
                                                float dloss);
Tensor sparse_categorical_crossentropy_backward(const Tensor& logits_or_probs, const Tensor& labels, bool from_logits,
                                                const Tensor& dloss);

// Same with one-hot or soft targets (B, C) float.
Tensor categorical_crossentropy(const Tensor& logits_or_probs, const Tensor& targets, bool from_logits);
Tensor categorical_crossentropy_backward(const Tensor& logits_or_probs, const Tensor& targets, bool from_logits,
                                         float dloss);
Tensor categorical_crossentropy_backward(const Tensor& logits_or_probs, const Tensor& targets, bool from_logits,
                                         const Tensor& dloss);

// Mean squared error over all elements (any rank, same shapes), float32 scalar.
Tensor mean_squared_error(const Tensor& pred, const Tensor& target);
Tensor mean_squared_error_backward(const Tensor& pred, const Tensor& target, float dloss);
Tensor mean_squared_error_backward(const Tensor& pred, const Tensor& target, const Tensor& dloss);

// Sum / mean of all elements as a float32 scalar (accumulated in double for stability of large counts).
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);
// Gradient of sum / mean: dloss broadcast to x's shape and dtype.
Tensor sum_backward(const Tensor& x, float dloss);
Tensor mean_backward(const Tensor& x, float dloss);

// A kernel regularizer's penalty: sum over w of l1 |w| + l2 w^2 (w widened to float32, terms and sum in double,
// rounded once), a float32 scalar on w's device. Its gradient dpenalty (l1 sign(w) + 2 l2 w) is float32 of w's
// shape; dpenalty is one float32 element on w's device, read there (l1, l2 finite and >= 0).
Tensor regularization_penalty(const Tensor& w, float l1, float l2);
Tensor regularization_penalty_backward(const Tensor& w, float l1, float l2, const Tensor& dpenalty);

// Fraction of rows whose arg-max equals the label (float32 arithmetic); labels int32 or int64.
double sparse_categorical_accuracy(const Tensor& scores, const Tensor& labels);
// The number of those rows as a float32 (1,) tensor on the inputs' device (exact up to 2^24 rows): what a training
// step on a GPU logs without waiting to read it.
Tensor count_correct(const Tensor& scores, const Tensor& labels);
// The number of rows whose label is among the k largest scores (Keras' sparse_top_k_categorical_accuracy), as a
// float32 (1,) tensor on the inputs' device. Ties count for the label, as TensorFlow's in_top_k: a row counts when
// fewer than k scores are strictly greater than the label's (so with k >= C every row with a non-NaN label score
// counts); a NaN label score never counts. k >= 1. Compared in float32, an exact integer count.
Tensor count_in_top_k(const Tensor& scores, const Tensor& labels, int64_t k);

namespace kernel {
// x (B, C) floating. target: labels (B,) int32/int64 in [0, C) when sparse, else (B, C) floating.
// loss: float32 scalar, the mean over rows of the cross-entropy.
using CrossentropyFn = void(const Tensor& x, const Tensor& target, bool sparse, bool from_logits, Tensor& loss);
// dx (B, C), x's dtype: the gradient of the loss times dloss, a float32 (1,) tensor on the kernel's device.
using CrossentropyBackwardFn = void(const Tensor& x, const Tensor& target, bool sparse, bool from_logits,
                                    const Tensor& dloss, Tensor& dx);
// loss: float32 scalar mean of (pred - target)^2; dx: 2 dloss (pred - target) / n in pred's dtype.
using MseFn = void(const Tensor& pred, const Tensor& target, Tensor& loss);
using MseBackwardFn = void(const Tensor& pred, const Tensor& target, const Tensor& dloss, Tensor& dx);
// out: float32 scalar, the sum of all elements of x (divided by their count when mean).
using SumAllFn = void(const Tensor& x, bool mean, Tensor& out);
// out: float32 scalar, the penalty of w; dw: float32 of w's size, its gradient times dpenalty (float32 (1,)).
using PenaltyFn = void(const Tensor& w, float l1, float l2, Tensor& out);
using PenaltyBackwardFn = void(const Tensor& w, float l1, float l2, const Tensor& dpenalty, Tensor& dw);
// Number of rows of scores (B, C) whose first arg-max equals the label.
using AccuracyFn = int64_t(const Tensor& scores, const Tensor& labels);
// The same count written into count, a float32 (1,) tensor on the kernel's device.
using CountCorrectFn = void(const Tensor& scores, const Tensor& labels, Tensor& count);
// Rows of scores (B, C) (B >= 1) in the top k, written into count, a float32 (1,) tensor on the kernel's device. A
// label outside [0, C) is not counted (the loss and the accuracy name it).
using CountInTopKFn = void(const Tensor& scores, const Tensor& labels, int64_t k, Tensor& count);
}  // namespace kernel
MIXTRAIN_KERNEL_SIGNATURE(crossentropy, CrossentropyFn)
MIXTRAIN_KERNEL_SIGNATURE(crossentropy_backward, CrossentropyBackwardFn)
MIXTRAIN_KERNEL_SIGNATURE(mse, MseFn)
MIXTRAIN_KERNEL_SIGNATURE(mse_backward, MseBackwardFn)
MIXTRAIN_KERNEL_SIGNATURE(sum_all, SumAllFn)
MIXTRAIN_KERNEL_SIGNATURE(penalty, PenaltyFn)
MIXTRAIN_KERNEL_SIGNATURE(penalty_backward, PenaltyBackwardFn)
MIXTRAIN_KERNEL_SIGNATURE(accuracy, AccuracyFn)
MIXTRAIN_KERNEL_SIGNATURE(count_correct, CountCorrectFn)
MIXTRAIN_KERNEL_SIGNATURE(count_in_top_k, CountInTopKFn)

}  // namespace mixtrain::ops
