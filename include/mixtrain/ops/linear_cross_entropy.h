// A language model's output projection and its sparse categorical cross-entropy, fused over chunks of rows, so the
// (rows, vocabulary) float32 logits never exist whole: each chunk's logits are computed by the GEMM into float32,
// reduced to the chunk's losses (log-sum-exp in float32) and arg-max, and, when a gradient is asked for, turned at
// once into the chunk's dlogits, its rows of dx and its share of dw and dbias. The backward pass then needs no saved
// logits. Equal to linear() (float32 output) then sparse_categorical_crossentropy(from_logits) within float32
// rounding; bit-reproducible and independent of the thread count.
#pragma once

#include <cstdint>

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

struct LinearCrossEntropy {
  Tensor loss;     // () float32: the mean over rows of -log softmax(x w + bias)[label]
  Tensor correct;  // (1,) float32: the rows whose first arg-max is their label (an exact count up to 2^24 rows)
  Tensor dx;       // (N, D) x's dtype: seed times the loss's gradient (defined when a seed was given)
  Tensor dw;       // (D, V) float32, likewise
  Tensor dbias;    // (V,) float32, likewise, when bias is defined
};

// x (N, D) and w (D, V) share a floating dtype; bias (V,) float32 or undefined; labels (N,) int32 or int64 in
// [0, V). seed: undefined (the loss and count only), or one floating element on x's device, the upstream gradient
// of the loss (a loss scale times a micro-batch's share), by which the gradients are multiplied as they are made.
// chunk_rows: rows per chunk (0: linear_cross_entropy_chunk_rows(V)). Losses are summed in double in row order,
// dw and dbias accumulate in float32 chunk by chunk in row order, so the bits depend on chunk_rows, not on threads.
LinearCrossEntropy linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& labels,
                                        const Tensor& seed = Tensor(), int64_t chunk_rows = 0);
// The default rows per chunk: as many as keep a chunk's float32 logits within 4 MiB (at least 16, at most 4096).
int64_t linear_cross_entropy_chunk_rows(int64_t vocabulary);

namespace kernel {
// Validated, contiguous operands; loss () and correct (1,) float32 always written. When seed is defined (one
// float32 element), dx (N, D) x's dtype, dw (D, V) float32 and dbias (V,) float32 (when bias is defined) are
// written; otherwise they are undefined and untouched. chunk_rows >= 1.
using LinearCrossEntropyFn = void(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& labels,
                                  const Tensor& seed, int64_t chunk_rows, Tensor& loss, Tensor& correct, Tensor& dx,
                                  Tensor& dw, Tensor& dbias);
}  // namespace kernel
MIXTRAIN_KERNEL_SIGNATURE(linear_cross_entropy, LinearCrossEntropyFn)

}  // namespace mixtrain::ops
