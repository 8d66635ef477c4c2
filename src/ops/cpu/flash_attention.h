// The CPU kernels of the tiled attention (ops/flash_attention.h), called by its entries alone: tensors arrive
// validated, q, k, v (and dq, dk, dv) as (B, L, W) with dense rows and any row and batch strides, every other tensor
// contiguous and preallocated.
#pragma once

#include "mixtrain/ops/attention.h"
#include "mixtrain/ops/flash_attention.h"

namespace mixtrain::ops::cpu {

// The tile: query rows per task and key columns per step (fixed, so the results never depend on the threads).
inline constexpr int64_t kFlashRows = 128;
inline constexpr int64_t kFlashColumns = kFlashAttentionKeyTile;

// out (B, T, H * dv) in q's dtype, lse (B, H, T) float32.
void flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options, Tensor& out,
                     Tensor& lse);
// dout in q's dtype; dq, dk, dv overwritten.
void flash_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, const AttentionOptions& options, Tensor& dq, Tensor& dk, Tensor& dv);

}  // namespace mixtrain::ops::cpu
