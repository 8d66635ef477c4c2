// Rotary position embeddings (RoPE, Su et al. 2021) in the rotate-half convention of GPT-NeoX and Llama (Hugging
// Face's rotate_half): a head of head_dim features is split into halves a = x[0 : h] and b = x[h : 2h], h =
// head_dim / 2, and pair i turns by the angle p * base^(-2i / head_dim) of its position p:
//   y[i] = a_i cos - b_i sin,   y[h + i] = b_i cos + a_i sin.
// (GPT-J and the original paper rotate interleaved pairs (x[2i], x[2i + 1]) instead; the two differ by a fixed
// permutation of the projection's columns.) The angles are computed in double and their cosines and sines rounded
// once into float32 whatever the policy: a bfloat16 position times a frequency would lose the position past 256,
// and float16's would cross 2048 as infinity. Each output element is two float32 products and one sum, rounded once
// into x's dtype; the CUDA kernel runs the same element arithmetic (shared/rotary_math.h) on the same tables, so
// both devices give the same bits. A rotation keeps each pair's length, so nothing grows toward overflow.
#pragma once

#include <cstdint>

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

struct RotaryOptions {
  int64_t head_dim = 0;       // even; the features of one head
  int64_t rotated_width = 0;  // columns [0, rotated_width) rotated, heads side by side; the rest copied
  int64_t offset = 0;         // the position of row t is offset + t (a cached generation step's new rows)
  double base = 10000.0;      // the frequencies' base (Llama's 10000)
};

// x (batch, T, C) of a floating dtype, rotated_width a multiple of head_dim and at most C -> y of x's shape and dtype.
Tensor rotary_embedding(const Tensor& x, const RotaryOptions& options);
// The gradient: each pair turned back by its angle (the rotation's transpose); dx of dy's shape and dtype.
Tensor rotary_embedding_backward(const Tensor& dy, const RotaryOptions& options);
// The float32 tables (T, head_dim / 2) of cos and sin of (offset + t) * base^(-2i / head_dim), computed in double.
void rotary_tables(int64_t length, const RotaryOptions& options, Tensor& cos, Tensor& sin);

namespace kernel {
// y = x turned by +angle (inverse: by -angle) per pair; x and y contiguous (batch, T, C), same shape, floating; cos
// and sin contiguous float32 (T, head_dim / 2) on x's device.
using RotaryEmbeddingFn = void(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t head_dim,
                               int64_t rotated_width, bool inverse, Tensor& y);
}  // namespace kernel
MIXTRAIN_KERNEL_SIGNATURE(rotary_embedding, RotaryEmbeddingFn)

}  // namespace mixtrain::ops
