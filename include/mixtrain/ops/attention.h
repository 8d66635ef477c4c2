// Scaled dot-product attention on the packed multi-head layout, forward and backward side by side.
// q (B, T, H * dk), k (B, S, H * dk) and v (B, S, H * dv) hold head h in columns [h * d, (h + 1) * d), as
// the query / key / value projections write them, so no transpose is ever made: every product reads its
// head in place (row stride H * d) through kernels::gemm, one (batch, head) pair at a time.
//
// Per pair, in this order (what runs in float32 and why: docs/MIXED_PRECISION.md, "Transformer layers"):
//   logits  s = (q_h k_h^T) * scale         accumulated in float32, then rounded into the compute dtype
//                                           (q's dtype), exactly as a 16-bit GEMM output would be: a
//                                           float16 logit beyond 65504 becomes inf, and the row NaN;
//   causal  row i keeps columns j <= i       by selection: masked positions never enter the softmax and
//           (j <= i + S - T when T < S)     get probability exactly 0 (no large negative constant); with
//                                           fewer queries than keys the queries are the last T positions
//                                           (a generation cache's new rows after S - T cached ones);
//   softmax p = softmax(s) per row           in float32 (max-subtracted), rounded once into the compute
//                                           dtype: the one (B, H, T, S) tensor kept for backward;
//   dropout p_d = p * keep / (1 - rate)      on the probabilities; keep is drawn per element from a
//                                           counter-based hash of (seed, position), so the mask is never
//                                           stored and backward draws the same one;
//   output  o_h = p_d v_h                    float32 accumulation, rounded once into (B, T, H * dv).
// q, k and v may be views whose rows are strided but dense (unit stride along the last axis), such as
// column slices of one fused (B, T, 3 * H * dk) projection: they are read in place, not copied.
// Scratch is per (batch, head): the float32 logits of one pair, and one 16-bit copy of its dropped
// probabilities when dropout is on. Pairs run in parallel when there are at least as many as threads
// (each GEMM then on its own thread), else one after another with the GEMMs threaded; either way every
// result is bit-identical for any thread count.
#pragma once

#include <cstdint>

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

struct AttentionOptions {
  int64_t num_heads = 1;
  // Row i attends to columns j <= i + S - T only (needs T <= S; T == S: j <= i).
  bool causal = false;
  // Multiplies q k^T (usually 1 / sqrt(dk)).
  float scale = 1.0f;
  // Dropout on the probabilities, in [0, 1); 0 is off.
  float dropout_rate = 0.0f;
  // Chooses the dropout mask (attention_dropout_keep); the same seed gives the same mask.
  uint64_t dropout_seed = 0;
};

struct AttentionOutput {
  Tensor out;    // (B, T, H * dv), q's dtype
  Tensor probs;  // (B, H, T, S), q's dtype: the softmax before dropout, for backward (undefined unless kept)
  // float32, 1-D: every logit that enters a softmax, before its rounding into the compute dtype, in (batch,
  // head, row, column) order with causally masked positions left out (B * H * T * S values, or
  // B * H * (T * (T + 1) / 2 + T * (S - T)) when causal). Undefined unless asked for (inspection only).
  Tensor logits;
};

// The attention above. q, k, v share one floating dtype; H divides their last axes. keep_probs: save the
// probabilities for backward (training); return_logits: also return the float32 logits.
AttentionOutput scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& options, bool keep_probs = true,
                                             bool return_logits = false);

struct AttentionGrads {
  Tensor dq, dk, dv;  // shapes and dtype of q, k, v
};
// Gradients given dout (the output's shape, any floating dtype: converted to q's dtype first, as
// linear_backward does) and the saved probabilities. Per pair: dp_d = dout_h v_h^T and
// ds = p * (dp - rowsum(dp * p)) * scale (dp = dp_d * keep / (1 - rate)) in float32; dv_h = p_d^T dout_h with
// the 16-bit p_d as forward used it; dq_h = ds k_h and dk_h = ds^T q_h as float32 products (ds is not rounded
// to 16 bits; k_h and q_h are widened per pair), each result rounded once. The rounding of the logits is
// differentiated as the identity.
AttentionGrads scaled_dot_product_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                     const Tensor& v, const Tensor& probs,
                                                     const AttentionOptions& options);
// The same gradients written into dq, dk and dv (shapes and dtype of q, k, v), which may be row-strided
// views as q, k, v may: e.g. the three column slices of one (B, T, 3 * H * dk) gradient of a fused
// projection, so no copy and no sum is needed. They must not overlap each other or any input.
void scaled_dot_product_attention_backward_into(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                                const Tensor& probs, const AttentionOptions& options, Tensor& dq,
                                                Tensor& dk, Tensor& dv);

// Whether dropout keeps the probability at flat (batch, head, row, column) index `index` of a
// (B, H, T, S) tensor: a 24-bit uniform from a hash of (seed, index), kept when >= rate. Public so tests
// and other backends draw the same mask.
bool attention_dropout_keep(uint64_t seed, uint64_t index, float rate);

namespace kernel {
// Tensors arrive validated; q, k, v (and dq, dk, dv) are (B, L, W) with unit stride along W and any row and
// batch strides (the kernel reads strides() and raw()); every other tensor is contiguous. out is
// preallocated; probs and logits are preallocated or undefined (not wanted).
using AttentionFn = void(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                         Tensor& out, Tensor& probs, Tensor& logits);
// dout is in q's dtype; dq, dk, dv are preallocated and overwritten.
using AttentionBackwardFn = void(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& probs, const AttentionOptions& options, Tensor& dq, Tensor& dk,
                                 Tensor& dv);
}  // namespace kernel
MIXTRAIN_KERNEL_SIGNATURE(attention, AttentionFn)
MIXTRAIN_KERNEL_SIGNATURE(attention_backward, AttentionBackwardFn)

}  // namespace mixtrain::ops
