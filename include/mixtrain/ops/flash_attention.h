// Tiled scaled dot-product attention with an online softmax (the flash-attention algorithm), forward and backward
// side by side: the attention of ops/attention.h (same packed layout, options, logit rounding, causal selection and
// dropout mask) without the (B, H, T, S) probabilities. What it keeps for backward is the output and one float32
// log-sum-exp per query row, (B, H, T); backward recomputes the logits tile by tile. Memory beyond the inputs and
// outputs is a few (128 x 128) float32 tiles and O(T * head_dim) float32 rows per running (batch, head) pair: it
// grows linearly with the context, where scaled_dot_product_attention's kept probabilities grow with its square.
//
// Forward, per (batch, head, tile of 128 query rows), key tiles of 128 columns in order:
//   s = (q k^T) * scale      a float32 GEMM tile, rounded into the compute dtype (q's) as attention.h's logits are;
//   causal                   key tiles wholly past a tile's last allowed column are never computed; inside a
//                            tile the masked columns are left out of the maximum and the sum (by selection);
//   online softmax           float32 running maximum m and sum l per row: p = e^(s - m_new), l = l e^(m - m_new)
//                            + sum p, the float32 output accumulator rescaled by e^(m - m_new);
//   dropout                  p * keep / (1 - rate) enters the product with v (not the sum), the mask drawn by
//                            attention_dropout_keep at the same (batch, head, row, column) index as attention.h;
//   output                   o = acc / l, rounded once; lse = m + log(l) in float32.
// p is rounded into the compute dtype before its product with v, so 16-bit products run on kernels::gemm's fastest
// path (AMX tiles or vdpbf16ps for bfloat16). Results match scaled_dot_product_attention within float32 rounding
// (float32) or a few units in the last place of the compute dtype (16-bit): the probabilities are rounded
// unnormalised rather than normalised, and the sums run in another order.
// Backward, per (batch, head): D = rowsum(dout * out) in float32, then for every key tile, for every query tile that
// sees it: p = e^(s - lse) from the recomputed (rounded) logits, dp = (dout v^T) * keep / (1 - rate),
// ds = p (dp - D) * scale in float32; dv += p_d^T dout (p_d rounded into the compute dtype, as forward multiplied
// it), dk += ds^T q and dq += ds k as float32 products (ds is never rounded to 16 bits), each gradient rounded once.
// Work is split over (batch, head, query tile) in forward and over (batch, head) in backward, every tile in a fixed
// order, so every result is bit-identical for any thread count. The kernels run on the CPU and, in a build with the
// CUDA backend, on a GPU (src/ops/cuda/flash_attention.cu: the same steps one row per thread, over 64-column key
// tiles, so within the tolerances above of the CPU's; docs/GPU.md), each a kernel of its backend's table; a tensor
// on a device without them is refused (flash_attention_supported says where they run).
#pragma once

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/attention.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

struct FlashAttentionOutput {
  Tensor out;  // (B, T, H * dv), q's dtype
  Tensor lse;  // (B, H, T) float32: each row's log-sum-exp of its (rounded, scaled) logits, for backward
};

// Key columns per tile of the CPU kernel: up to one tile the full attention is the better choice (below).
inline constexpr int64_t kFlashAttentionKeyTile = 128;

// Whether flash_attention runs on tensors of this device: a backend there has its kernels (the CPU's, and the CUDA
// backend's once loaded on a GPU).
bool flash_attention_supported(const Device& device);
// Whether flash_attention is the better choice for `keys` keys on this device: supported there, and more keys than
// one key tile (128). Up to one tile scaled_dot_product_attention's (T, S) scratch per pair is no larger than the
// tiled kernel's tiles and its backward reads the kept probabilities instead of recomputing them, so it is faster
// (bench/attention_bench BM_attention_op: 1.4x at T = 64) and holds little: (B, H, T, S) 16-bit values of at most
// 128 columns.
bool flash_attention_preferred(const Device& device, int64_t keys);

// The attention above; q, k, v as scaled_dot_product_attention takes them (views with dense rows read in place).
FlashAttentionOutput flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options);

// Gradients given dout (the output's shape, any floating dtype: converted to q's dtype first), the forward's out and
// lse, and the same options (the same dropout seed). Written into dq, dk, dv (q, k, v's shapes and dtype; row-strided
// views allowed, not overlapping each other or any input), as scaled_dot_product_attention_backward_into does.
void flash_attention_backward_into(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out, const Tensor& lse, const AttentionOptions& options, Tensor& dq,
                                   Tensor& dk, Tensor& dv);
// The same gradients in new tensors.
AttentionGrads flash_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& out, const Tensor& lse, const AttentionOptions& options);

namespace kernel {
// Validated operands: q, k, v (and dq, dk, dv) (B, L, W) with dense rows and any row and batch strides, every other
// tensor contiguous and preallocated on their device; dout in q's dtype. out (B, T, H * dv) in q's dtype and lse
// (B, H, T) float32 written; dq, dk, dv overwritten.
using FlashAttentionFn = void(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                              Tensor& out, Tensor& lse);
using FlashAttentionBackwardFn = void(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Tensor& out, const Tensor& lse, const AttentionOptions& options,
                                      Tensor& dq, Tensor& dk, Tensor& dv);
}  // namespace kernel
MIXTRAIN_KERNEL_SIGNATURE(flash_attention, FlashAttentionFn)
MIXTRAIN_KERNEL_SIGNATURE(flash_attention_backward, FlashAttentionBackwardFn)

}  // namespace mixtrain::ops
