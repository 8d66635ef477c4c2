// The tiled attention's operands as its row functions read them (shared/flash_attention_rows.h), from tensors. Plain
// C++, no CUDA type: the GPU kernels (flash_attention.cu) and their host driver in the tests
// (tests/ops/flash_attention_rows_test.cpp) build the same problem.
#pragma once

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/attention.h"
#include "../shared/flash_attention_rows.h"

namespace mixtrain::ops::cuda {

// t (B, L, H * d), dense rows, any row and batch strides: its heads.
inline shared::FlashHeads flash_heads(const Tensor& t, int64_t heads) {
  return shared::FlashHeads{const_cast<void*>(t.raw()), shared::float_code(t.dtype()), t.strides()[0],
                            t.strides()[1], t.dim(2) / heads, heads};
}

// q (B, T, H * dk), k (B, S, H * dk), v (B, S, H * dv) of one floating dtype, validated by the op.
inline shared::FlashProblem flash_problem(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const AttentionOptions& o) {
  const int64_t h = o.num_heads;
  shared::FlashProblem p{};
  p.q = flash_heads(q, h);
  p.k = flash_heads(k, h);
  p.v = flash_heads(v, h);
  p.t = q.dim(1);
  p.s = k.dim(1);
  p.dk = q.dim(2) / h;
  p.dv = v.dim(2) / h;
  p.causal = o.causal;
  p.scale = o.scale;
  p.rate = o.dropout_rate;
  p.inv_keep = 1.0f / (1.0f - o.dropout_rate);
  p.seed = o.dropout_seed;
  p.code = shared::float_code(q.dtype());
  return p;
}

}  // namespace mixtrain::ops::cuda
