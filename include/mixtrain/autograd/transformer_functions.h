// Differentiable embedding lookup, position embeddings, layer normalization and scaled dot-product
// attention on Vars: the pieces of a transformer block. Each runs the forward op from mixtrain::ops and,
// when recording, tapes the matching backward op (ops/embedding.h, ops/layer_norm.h, ops/attention.h say
// what each computes and accumulates in).
#pragma once

#include "mixtrain/autograd/tape.h"
#include "mixtrain/ops/attention.h"
#include "mixtrain/ops/embedding.h"
#include "mixtrain/ops/layer_norm.h"

namespace mixtrain {

// ids (...) int32/int64 (a constant) select rows of table (input_dim, output_dim) -> (..., output_dim) in
// out_dtype. The table's gradient is scatter-added in float32 (repeated ids accumulate) and converted
// into the table's dtype when it is added.
Var embedding(const Tensor& ids, const Var& table, DType out_dtype);

// x (batch, T, D) + table[0:T] (table (sequence_length, D), T <= sequence_length), broadcast over the
// batch: computed in float32 from the table's own values, rounded once into x's dtype. The table's
// gradient is the float32 batch sum of the output gradient in rows [0, T), zero below.
Var add_position_embedding(const Var& x, const Var& table);

// Normalizes x over its last axis with gamma and beta (float32 Vars (D,)): ops::layer_norm, statistics
// and backward in float32, output in x's dtype.
Var layer_norm(const Var& x, const Var& gamma, const Var& beta, float epsilon);

// Attention of q, k, v in the packed (batch, length, heads * head_dim) layout (ops::AttentionOptions: heads,
// causal, scale, dropout rate and seed). The probabilities are kept for backward only when recording.
// logits: when not null, receives the float32 logits before their rounding (ops::AttentionOutput::logits).
Var scaled_dot_product_attention(const Var& q, const Var& k, const Var& v, const ops::AttentionOptions& options,
                                 Tensor* logits = nullptr);

}  // namespace mixtrain
