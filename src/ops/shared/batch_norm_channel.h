// Batch normalization's per-channel and per-element arithmetic (the op: ops/batch_norm.h), float32 whatever the
// storage dtype, written once for the CPU kernel (cpu/batch_norm.cpp, which calls these in its vectorised loops)
// and the GPU kernel (cuda/batch_norm.cu).
//
// x is (rows, C). Every per-channel sum runs through fixed blocks of kBatchNormRowsPerBlock rows: each block's sum
// from +0 in row order, each partial sum rounded, then the blocks' sums from +0 in block order. A kernel that keeps
// these blocks and orders (one thread per block and channel, then one per channel) gives the CPU's bits.
//   moments:   mean = sum(x) * (1 / rows),   variance = sum((x - mean)^2) * (1 / rows)
//   forward:   scale = 1 / sqrt(variance + epsilon) * gamma,   y = (x - mean) * scale + beta
//   backward:  inv_std = 1 / sqrt(variance + epsilon),  dbeta = sum(dy),  dgamma = sum(dy * (x - mean) * inv_std)
//              dx = gamma * inv_std * ((dy - mean_dy) - xhat * mean_dyx), xhat = (x - mean) * inv_std, where with
//              batch statistics mean_dy = dbeta / rows and mean_dyx = dgamma / rows, else both 0
#pragma once

#include <cstdint>

#include "host_device.h"

namespace mixtrain::ops::shared {

// Rows per block of the per-channel sums. Part of the results' bits: both backends use this value.
constexpr int64_t kBatchNormRowsPerBlock = 256;

MIXTRAIN_HOST_DEVICE inline float batch_norm_inv_rows(int64_t rows) { return div_rn(1.0f, static_cast<float>(rows)); }

// The moments' terms: x itself (first pass), its squared deviation from the mean (second pass).
MIXTRAIN_HOST_DEVICE inline float batch_norm_square_dev(float x, float mean) {
  const float d = sub_rn(x, mean);
  return mul_rn(d, d);
}

MIXTRAIN_HOST_DEVICE inline float batch_norm_inv_std(float variance, float epsilon) {
  return div_rn(1.0f, sqrt_rn(add_rn(variance, epsilon)));
}

// The forward's per-channel factor gamma / sqrt(variance + epsilon), in the CPU's order.
MIXTRAIN_HOST_DEVICE inline float batch_norm_scale(float variance, float epsilon, float gamma) {
  return mul_rn(batch_norm_inv_std(variance, epsilon), gamma);
}

// One output element, before its rounding into the output dtype.
MIXTRAIN_HOST_DEVICE inline float batch_norm_value(float x, float mean, float scale, float beta) {
  return add_rn(mul_rn(sub_rn(x, mean), scale), beta);
}

// The backward's dgamma term dy * (x - mean) * inv_std, in that order.
MIXTRAIN_HOST_DEVICE inline float batch_norm_dgamma_term(float dy, float x, float mean, float inv_std) {
  return mul_rn(mul_rn(dy, sub_rn(x, mean)), inv_std);
}

// mean_dy or mean_dyx from a channel's sum (0 without batch statistics or rows).
MIXTRAIN_HOST_DEVICE inline float batch_norm_grad_mean(float sum, int64_t rows, bool batch_statistics) {
  return batch_statistics && rows > 0 ? div_rn(sum, static_cast<float>(rows)) : 0.0f;
}

// One dx element before its rounding, k = gamma * inv_std.
MIXTRAIN_HOST_DEVICE inline float batch_norm_dx(float dy, float x, float mean, float inv_std, float k, float mean_dy,
                                                float mean_dyx) {
  const float xhat = mul_rn(sub_rn(x, mean), inv_std);
  return mul_rn(k, sub_rn(sub_rn(dy, mean_dy), mul_rn(xhat, mean_dyx)));
}

// Channel j's sum of term(r) over rows [r0, r1), from +0 in row order: one block's partial sum.
template <typename Term>
MIXTRAIN_HOST_DEVICE inline float batch_norm_block_sum(int64_t r0, int64_t r1, const Term& term) {
  float s = 0.0f;
  for (int64_t r = r0; r < r1; ++r) s = add_rn(s, term(r));
  return s;
}

// A moving statistic after one batch: moving * momentum + batch * (1 - momentum), one_minus = 1 - momentum in float32.
MIXTRAIN_HOST_DEVICE inline float moving_average(float moving, float batch, float momentum, float one_minus) {
  return add_rn(mul_rn(moving, momentum), mul_rn(batch, one_minus));
}

}  // namespace mixtrain::ops::shared
