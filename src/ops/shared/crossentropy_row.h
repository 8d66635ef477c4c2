// Cross-entropy of one row, in float32 with the loss terms in double, written once for the CPU reference and the
// GPU kernels (the op: ops/losses.h). The row functions follow the CPU kernel's (cpu/losses.cpp) operation order,
// so on the host they give its bits; a GPU kernel combines the same element steps with a parallel max and sums.
//
// From logits z with target weights t (one-hot for sparse labels):
//   log p_j = z_j - logsumexp(z)          loss = -sum_j t_j log p_j
//   d loss / d z_j = k * (p_j * sum(t) - t_j),   k = dloss / rows (the loss is a mean over rows)
// From probabilities p (clipped to [1e-7, 1 - 1e-7] as Keras does):
//   loss = -sum_j t_j log clip(p_j)       d loss / d p_j = -k t_j / p_j, 0 where p_j was clipped
#pragma once

#include <cstdint>

#include "host_device.h"
#include "softmax_row.h"

namespace mixtrain::ops::shared {

constexpr float kProbEpsilon = 1e-7f;  // Keras' backend epsilon

// The gradient's factor for a mean over rows, scaled by the upstream gradient (rows 0 counts as 1).
MIXTRAIN_HOST_DEVICE inline float crossentropy_grad_scale(float dloss, int64_t rows) {
  return div_rn(dloss, static_cast<float>(rows > 1 ? rows : 1));
}

// One row's loss term for target weight w (callers skip w == 0, so a log p of -inf times 0 adds nothing).
MIXTRAIN_HOST_DEVICE inline double crossentropy_term(float w, float log_p) {
  return -(static_cast<double>(w) * static_cast<double>(log_p));
}

MIXTRAIN_HOST_DEVICE inline float clipped_log_prob(float p) {
  const float lo = kProbEpsilon, hi = 1 - kProbEpsilon;
  return log_f32(p < lo ? lo : hi < p ? hi : p);
}

// Element gradients; tsum is the row's sum of target weights (1 for a label).
MIXTRAIN_HOST_DEVICE inline float crossentropy_logits_grad(float log_p, float w, float tsum, float k) {
  return mul_rn(k, sub_rn(mul_rn(exp_f32(log_p), tsum), w));
}
MIXTRAIN_HOST_DEVICE inline float crossentropy_probs_grad(float p, float w, float k) {
  const bool clipped = p < kProbEpsilon || p > 1 - kProbEpsilon;
  return clipped ? 0.0f : div_rn(mul_rn(-k, w), p);
}

// logsumexp of one row of logits, in the CPU's order.
MIXTRAIN_HOST_DEVICE inline float row_log_sum_exp(const float* z, int64_t n) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) mx = max_f32(mx, z[j]);
  float sum = 0;
  for (int64_t j = 0; j < n; ++j) sum = add_rn(sum, softmax_term(z[j], mx));
  return log_sum_exp(mx, sum);
}

// Sparse cross-entropy from logits, one row: -log softmax(z)[label]. The caller sums rows in double, from 0 in
// row order, and divides by the row count (the CPU kernel's mean).
MIXTRAIN_HOST_DEVICE inline double sparse_logits_row_loss(const float* z, int64_t n, int64_t label) {
  return crossentropy_term(1.0f, log_softmax_value(z[label], row_log_sum_exp(z, n)));
}

// Its gradient over the row: k * (softmax(z) - onehot(label)), k = crossentropy_grad_scale(dloss, rows).
MIXTRAIN_HOST_DEVICE inline void sparse_logits_row_grad(const float* z, int64_t n, int64_t label, float k, float* dz) {
  const float lse = row_log_sum_exp(z, n);
  for (int64_t j = 0; j < n; ++j)
    dz[j] = crossentropy_logits_grad(log_softmax_value(z[j], lse), j == label ? 1.0f : 0.0f, 1.0f, k);
}

}  // namespace mixtrain::ops::shared
