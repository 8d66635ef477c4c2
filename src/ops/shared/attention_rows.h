// The element steps of scaled dot-product attention's rows (ops/attention.h gives the computation), for host and
// device: the dropout mask's hash (dropout_keep.h), which ops::attention_dropout_keep is, the dropped probability
// and the softmax gradient's element, each in the CPU kernel's operation order (cpu/attention.cpp); the logit's
// rounding into the compute dtype is through_dtype (float16_convert.h). The GPU kernel (cuda/attention.cu)
// combines them with a warp's max and sums in its own order, and its products run through cuBLASLt, so it matches
// the CPU within tolerances; the mask is the same bit for bit.
#pragma once

#include <cstdint>

#include "dropout_keep.h"
#include "float16_convert.h"
#include "host_device.h"

namespace mixtrain::ops::shared {

// Whether dropout keeps the probability at flat (batch, head, row, column) index `index` (dropout_keep.h).
MIXTRAIN_HOST_DEVICE inline bool attention_dropout_keep(uint64_t seed, uint64_t index, float rate) {
  return dropout_keep(seed, index, rate);
}

// A causal pair's T query rows are the last T of its S positions (S - T earlier ones are a generation cache's keys;
// T == S in training), so row i takes part with columns [0, causal_row_end): j <= i + S - T.
MIXTRAIN_HOST_DEVICE inline int64_t causal_row_end(int64_t i, int64_t t, int64_t s) { return i + 1 + (s - t); }
// How many logits a causal pair's rows before row i keep (row i's first one in the returned logits); with i = T,
// the pair's count.
MIXTRAIN_HOST_DEVICE inline int64_t causal_logits_before(int64_t i, int64_t t, int64_t s) {
  return i * (i + 1) / 2 + i * (s - t);
}

// The dropped value of p (a probability, or its gradient): p / (1 - rate) where kept, else 0; inv_keep is
// 1.0f / (1.0f - rate) in float32.
MIXTRAIN_HOST_DEVICE inline float dropped(float p, bool keep, float inv_keep) { return keep ? mul_rn(p, inv_keep) : 0.0f; }

// The softmax gradient of one score: p * (dp - dot) * scale, dot = sum over the row of dp * p.
MIXTRAIN_HOST_DEVICE inline float attention_score_grad(float p, float dp, float dot, float scale) {
  return mul_rn(mul_rn(p, sub_rn(dp, dot)), scale);
}

}  // namespace mixtrain::ops::shared
