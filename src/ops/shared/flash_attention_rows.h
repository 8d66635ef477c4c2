// The tiled attention's arithmetic for one query row or one key row (ops/flash_attention.h gives the computation),
// for host and device: the GPU kernels (cuda/flash_attention.cu) run these functions one thread per row, and a host
// loop over the same functions (tests/ops/flash_attention_rows_test.cpp) gives the kernels' bits on the CPU, the
// log of the log-sum-exp aside (glibc's logf and CUDA's may differ in the last place).
//
// The steps are the CPU kernel's (cpu/flash_attention.cpp), in one row's order rather than a tile's:
//   logit        fl32(q_i . k_j) * scale, rounded into the compute dtype (fused multiply-adds from +0, c in order)
//   key tiles    kFlashTileColumns columns at a time, up to the row's last allowed column: a causal row never
//                visits a tile past it, and inside its last tile the masked columns never enter the max or the sum
//   online       float32 running max m and sum l: m_new = max(m, tile max), l = l e^(m - m_new) + sum e^(s - m_new),
//                the float32 accumulator rescaled by e^(m - m_new) (shared/exp_poly.h's exponential: same bits on
//                both sides)
//   dropout      p * keep / (1 - rate) into the product with v (not the sum), the mask attention_dropout_keep at
//                flat (batch, head, row, column) index, as every attention kernel draws it
//   output       acc / l rounded once; lse = m + log(l) in float32
// Backward: D_i = rowsum(dout_i * out_i) in float32; p = e^(s - lse) from the recomputed logit, dp = dout_i . v_j
// dropped, ds = p (dp - D) * scale in float32; dv_j += p_d dout_i (p_d rounded into the compute dtype, as forward
// multiplied it), dq_i += ds k_j and dk_j += ds q_i in float32 (ds never rounded to 16 bits).
// The sums run in another order than the CPU kernel's tile GEMMs, so the results match it within float32 rounding
// (float32) or a few units of the compute dtype (16-bit); the dropout mask is the same bit for bit.
#pragma once

#include <cstdint>

#include "attention_rows.h"
#include "exp_poly.h"
#include "float16_convert.h"
#include "host_device.h"

namespace mixtrain::ops::shared {

// Key columns per step of a row's online softmax (a row's logits of one tile are held at once).
inline constexpr int64_t kFlashTileColumns = 64;

// A packed (B, L, H * d) tensor's heads: element c of row `row` of pair (batch, head) = pair / heads, pair % heads.
struct FlashHeads {
  void* base;
  int code;
  int64_t batch_stride, row_stride, d, heads;

  MIXTRAIN_HOST_DEVICE int64_t offset(int64_t pair, int64_t row) const {
    return (pair / heads) * batch_stride + row * row_stride + (pair % heads) * d;
  }
  MIXTRAIN_HOST_DEVICE float at(int64_t pair, int64_t row, int64_t c) const {
    return load_as_float(base, code, offset(pair, row) + c);
  }
  // Rounds v once into the element.
  MIXTRAIN_HOST_DEVICE void set(int64_t pair, int64_t row, int64_t c, float v) const {
    store_from_float(base, code, offset(pair, row) + c, v);
  }
};

// One attention call as the row functions read it: q (T rows), k and v (S rows) in the compute dtype `code`.
struct FlashProblem {
  FlashHeads q, k, v;
  int64_t t, s, dk, dv;
  bool causal;
  float scale, rate, inv_keep;  // inv_keep: 1.0f / (1.0f - rate) in float32, the CPU kernels' factor
  uint64_t seed;
  int code;

  // Columns [0, row_end) that query row i attends to.
  MIXTRAIN_HOST_DEVICE int64_t row_end(int64_t i) const { return causal ? causal_row_end(i, t, s) : s; }
  // The first query row that attends to key column j.
  MIXTRAIN_HOST_DEVICE int64_t first_row(int64_t j) const {
    const int64_t first = j - (s - t);
    return causal && first > 0 ? first : 0;
  }
  // Whether dropout keeps (pair, i, j): the (B, H, T, S) probabilities' flat index is the mask's counter.
  MIXTRAIN_HOST_DEVICE bool keep(int64_t pair, int64_t i, int64_t j) const {
    return rate <= 0.0f || attention_dropout_keep(seed, static_cast<uint64_t>((pair * t + i) * s + j), rate);
  }
};

// fl32(a_row . b_row) over n columns: fused multiply-adds from +0 in column order.
MIXTRAIN_HOST_DEVICE inline float flash_dot(const FlashHeads& a, int64_t pair, int64_t i, const FlashHeads& b,
                                            int64_t j, int64_t n) {
  float acc = 0.0f;
  for (int64_t c = 0; c < n; ++c) acc = fma_rn(a.at(pair, i, c), b.at(pair, j, c), acc);
  return acc;
}

// The logit (i, j) as the softmax reads it: the float32 product times the scale, rounded into the compute dtype.
MIXTRAIN_HOST_DEVICE inline float flash_logit(const FlashProblem& p, int64_t pair, int64_t i, int64_t j) {
  return through_dtype(mul_rn(flash_dot(p.q, pair, i, p.k, j, p.dk), p.scale), p.code);
}

// The running maximum's rescaling factor e^(m_old - m_new): 1 when the maximum did not move (also for a row that
// has seen only -inf), 0 from the first tile's -inf.
MIXTRAIN_HOST_DEVICE inline float flash_rescale(float m_old, float m_new) {
  return m_old == m_new ? 1.0f : expf_poly::exp(sub_rn(m_old, m_new));
}

// p (unnormalised, or normalised by the lse) dropped and rounded into the compute dtype: the operand of p v.
MIXTRAIN_HOST_DEVICE inline float flash_value_weight(const FlashProblem& p, int64_t pair, int64_t i, int64_t j,
                                                     float prob) {
  return through_dtype(p.rate > 0.0f ? dropped(prob, p.keep(pair, i, j), p.inv_keep) : prob, p.code);
}

// One query row forward: out row i (rounded once) and its float32 log-sum-exp, returned. acc: dv floats of scratch.
MIXTRAIN_HOST_DEVICE inline float flash_forward_row(const FlashProblem& p, const FlashHeads& out, int64_t pair,
                                                    int64_t i, float* acc) {
  for (int64_t e = 0; e < p.dv; ++e) acc[e] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  float w[kFlashTileColumns];  // the tile's logits, then its value weights
  const int64_t end = p.row_end(i);
  for (int64_t j0 = 0; j0 < end; j0 += kFlashTileColumns) {
    const int64_t cols = end - j0 < kFlashTileColumns ? end - j0 : kFlashTileColumns;
    float tile_max = -INFINITY;
    for (int64_t c = 0; c < cols; ++c) {
      w[c] = flash_logit(p, pair, i, j0 + c);
      tile_max = max_f32(tile_max, w[c]);
    }
    const float m_new = max_f32(m, tile_max), alpha = flash_rescale(m, m_new);
    float tile_sum = 0.0f;
    for (int64_t c = 0; c < cols; ++c) {
      const float e = expf_poly::exp(sub_rn(w[c], m_new));
      tile_sum = add_rn(tile_sum, e);
      w[c] = flash_value_weight(p, pair, i, j0 + c, e);
    }
    l = add_rn(mul_rn(l, alpha), tile_sum);
    m = m_new;
    for (int64_t e = 0; e < p.dv; ++e) {
      float a = mul_rn(acc[e], alpha);
      for (int64_t c = 0; c < cols; ++c) a = fma_rn(w[c], p.v.at(pair, j0 + c, e), a);
      acc[e] = a;
    }
  }
  const float inv = div_rn(1.0f, l);
  for (int64_t e = 0; e < p.dv; ++e) out.set(pair, i, e, mul_rn(acc[e], inv));
  return add_rn(m, log_f32(l));
}

// D_i = rowsum(dout_i * out_i) in float32, in column order.
MIXTRAIN_HOST_DEVICE inline float flash_row_dot(const FlashHeads& dout, const FlashHeads& out, int64_t pair,
                                                int64_t i, int64_t dv) {
  float acc = 0.0f;
  for (int64_t e = 0; e < dv; ++e) acc = add_rn(acc, mul_rn(dout.at(pair, i, e), out.at(pair, i, e)));
  return acc;
}

// One score's share of the gradients: pd, the dropped probability rounded into the compute dtype (dv's weight),
// and ds, the float32 score gradient (dq's and dk's).
struct FlashScoreGrad {
  float pd, ds;
};
MIXTRAIN_HOST_DEVICE inline FlashScoreGrad flash_score_grad(const FlashProblem& p, const FlashHeads& dout,
                                                            int64_t pair, int64_t i, int64_t j, float lse, float d) {
  const float prob = expf_poly::exp(sub_rn(flash_logit(p, pair, i, j), lse));
  float dp = flash_dot(dout, pair, i, p.v, j, p.dv);
  const bool keep = p.keep(pair, i, j);
  if (p.rate > 0.0f) dp = dropped(dp, keep, p.inv_keep);
  const float pd = through_dtype(p.rate > 0.0f ? dropped(prob, keep, p.inv_keep) : prob, p.code);
  return {pd, attention_score_grad(prob, dp, d, p.scale)};
}

// dq row i = sum over its columns of ds k_j (float32, column order), rounded once into dq. lse, d: the row's own.
// acc: dk floats of scratch.
MIXTRAIN_HOST_DEVICE inline void flash_dq_row(const FlashProblem& p, const FlashHeads& dout, const FlashHeads& dq,
                                              int64_t pair, int64_t i, float lse, float d, float* acc) {
  for (int64_t e = 0; e < p.dk; ++e) acc[e] = 0.0f;
  const int64_t end = p.row_end(i);
  for (int64_t j = 0; j < end; ++j) {
    const float ds = flash_score_grad(p, dout, pair, i, j, lse, d).ds;
    for (int64_t e = 0; e < p.dk; ++e) acc[e] = fma_rn(ds, p.k.at(pair, j, e), acc[e]);
  }
  for (int64_t e = 0; e < p.dk; ++e) dq.set(pair, i, e, acc[e]);
}

// dk row j = sum of ds q_i and dv row j = sum of p_d dout_i over the query rows that see column j (float32, row
// order), each rounded once. lse, d: the pair's (T) rows. acc_k, acc_v: dk and dv floats of scratch.
MIXTRAIN_HOST_DEVICE inline void flash_dkdv_row(const FlashProblem& p, const FlashHeads& dout, const FlashHeads& dk,
                                                const FlashHeads& dv, int64_t pair, int64_t j, const float* lse,
                                                const float* d, float* acc_k, float* acc_v) {
  for (int64_t e = 0; e < p.dk; ++e) acc_k[e] = 0.0f;
  for (int64_t e = 0; e < p.dv; ++e) acc_v[e] = 0.0f;
  for (int64_t i = p.first_row(j); i < p.t; ++i) {
    const FlashScoreGrad g = flash_score_grad(p, dout, pair, i, j, lse[i], d[i]);
    for (int64_t e = 0; e < p.dk; ++e) acc_k[e] = fma_rn(g.ds, p.q.at(pair, i, e), acc_k[e]);
    for (int64_t e = 0; e < p.dv; ++e) acc_v[e] = fma_rn(g.pd, dout.at(pair, i, e), acc_v[e]);
  }
  for (int64_t e = 0; e < p.dk; ++e) dk.set(pair, j, e, acc_k[e]);
  for (int64_t e = 0; e < p.dv; ++e) dv.set(pair, j, e, acc_v[e]);
}

}  // namespace mixtrain::ops::shared
