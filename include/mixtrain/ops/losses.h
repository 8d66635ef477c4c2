// Losses and reductions, forward and backward side by side. All accumulate and return float32
// whatever the input dtype (a float16 sum of a batch of losses overflows or loses the small terms);
// gradients come back in the input's dtype.
#pragma once

#include "mixtrain/core/tensor.h"

namespace mixtrain::ops {

// Mean over rows of -log p(label). logits_or_probs (B, C) any float dtype; labels (B,) int32 in [0, C).
// from_logits: inputs are logits (log-softmax inside); else probabilities, clipped to [1e-7, 1 - 1e-7] as Keras does.
// Returns a float32 scalar (shape ()).
Tensor sparse_categorical_crossentropy(const Tensor& logits_or_probs, const Tensor& labels, bool from_logits);
// Gradient for the inputs, scaled by dloss (the upstream gradient of the scalar loss).
Tensor sparse_categorical_crossentropy_backward(const Tensor& logits_or_probs, const Tensor& labels, bool from_logits,
                                                float dloss);

// Same with one-hot or soft targets (B, C) float.
Tensor categorical_crossentropy(const Tensor& logits_or_probs, const Tensor& targets, bool from_logits);
Tensor categorical_crossentropy_backward(const Tensor& logits_or_probs, const Tensor& targets, bool from_logits,
                                         float dloss);

// Mean squared error over all elements, float32 scalar.
Tensor mean_squared_error(const Tensor& pred, const Tensor& target);
Tensor mean_squared_error_backward(const Tensor& pred, const Tensor& target, float dloss);

// Sum / mean of all elements as a float32 scalar (accumulated in double for stability of large counts).
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);
// Gradient of sum / mean: dloss broadcast to x's shape and dtype.
Tensor sum_backward(const Tensor& x, float dloss);
Tensor mean_backward(const Tensor& x, float dloss);

// Fraction of rows whose arg-max equals the label (float32 arithmetic).
double sparse_categorical_accuracy(const Tensor& scores, const Tensor& labels);

}  // namespace mixtrain::ops
