// Differentiable embedding lookup, position embeddings, layer normalization and scaled dot-product
// attention on Vars: the pieces of a transformer block. Each runs the forward op from mixtrain::ops and,
// when recording, tapes the matching backward op (ops/embedding.h, ops/layer_norm.h, ops/attention.h say
// what each computes and accumulates in).
#pragma once

#include <vector>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/ops/attention.h"
#include "mixtrain/ops/embedding.h"
#include "mixtrain/ops/layer_norm.h"
#include "mixtrain/ops/rms_norm.h"
#include "mixtrain/ops/rotary_embedding.h"

namespace mixtrain {

// ids (...) int32/int64 (a constant) select rows of table (input_dim, output_dim) -> (..., output_dim) in
// out_dtype. The table's gradient is scatter-added in float32 (repeated ids accumulate) and converted
// into the table's dtype when it is added.
Var embedding(const Tensor& ids, const Var& table, DType out_dtype);

// x (batch, T, D) + table[offset:offset + T] (table (sequence_length, D), offset + T <= sequence_length), broadcast
// over the batch: computed in float32 from the table's own values, rounded once into x's dtype. The table's
// gradient is the float32 batch sum of the output gradient in rows [offset, offset + T), zero elsewhere. A nonzero
// offset places x after offset earlier positions (a cached generation step's new positions).
Var add_position_embedding(const Var& x, const Var& table, int64_t offset = 0);

// Normalizes x over its last axis with gamma and beta (float32 Vars (D,)): ops::layer_norm, statistics
// and backward in float32, output in x's dtype.
Var layer_norm(const Var& x, const Var& gamma, const Var& beta, float epsilon);

// x / sqrt(mean(x^2) + epsilon) * scale over x's last axis, scale a float32 Var (D,): ops::rms_norm, statistic and
// backward in float32, output in x's dtype.
Var rms_norm(const Var& x, const Var& scale, float epsilon);

// Rotary position embeddings on x (batch, T, C): ops::rotary_embedding (columns [0, options.rotated_width) turned
// in rotate-half pairs per head, float32 angle tables, output in x's dtype); backward turns the gradient back.
Var rotary_embedding(const Var& x, const ops::RotaryOptions& options);

// Several projections of x (batch, ..., D) as one product: kernel i is read as the (D, width_i) matrix it is
// in memory, its leading dimensions multiplying to D (a (D, heads, key_dim) kernel, or a (heads, key_dim,
// out) one on x (..., heads * key_dim)), kernel_computes[i] is that kernel in x's dtype (a cached
// cast), biases[i] is undefined or holds width_i elements of any floating dtype (added in float32). The
// result (batch, ..., sum of width_i) holds the projections side by side, in order. Backward runs one
// linear_backward: x receives one gradient (not one per projection, to be summed), and the float32 kernel
// and bias gradients are split back into the variables' shapes.
Var fused_projection(const Var& x, const std::vector<Var>& kernels, const std::vector<Tensor>& kernel_computes,
                     const std::vector<Var>& biases);

// Self-attention of a fused projection qkv (batch, T, 3 * H * dk): columns [0, H dk) are q, [H dk, 2 H dk)
// k, [2 H dk, 3 H dk) v, read in place. Backward writes dq, dk, dv into one gradient of qkv's shape.
Var packed_self_attention(const Var& qkv, const ops::AttentionOptions& options, Tensor* logits = nullptr);

// packed_self_attention on the tiled kernel (ops/flash_attention.h, CPU only): what backward keeps is the output and a
// (batch, heads, T) float32 log-sum-exp rather than the (batch, heads, T, T) probabilities.
Var packed_flash_attention(const Var& qkv, const ops::AttentionOptions& options);

// Attention of q, k, v in the packed (batch, length, heads * head_dim) layout (ops::AttentionOptions: heads,
// causal, scale, dropout rate and seed). The probabilities are kept for backward only when recording.
// logits: when not null, receives the float32 logits before their rounding (ops::AttentionOutput::logits).
Var scaled_dot_product_attention(const Var& q, const Var& k, const Var& v, const ops::AttentionOptions& options,
                                 Tensor* logits = nullptr);

}  // namespace mixtrain
