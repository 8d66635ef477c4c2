// Layer normalization's row and column arithmetic (the op: ops/layer_norm.h), float32 whatever the storage dtype,
// written once for the CPU kernel (cpu/layer_norm.cpp, which calls these) and the GPU kernel (cuda/layer_norm.cu).
// A row's sums (the statistics, and the backward's sums of g and g * xhat) run in the lanes' order of lane_sum.h,
// which a warp computes in parallel and the CPU in vector registers; the backward's column sums run from +0 one row
// after another in blocks. Any caller that keeps these orders gets the CPU's bits. A row type is anything with
// operator[](j) returning float: the CPU passes its float32 row buffer, the GPU a FloatView over the tensor's storage
// (float16_convert.h).
//
// Forward, per row x of length d:   mean = sum(x) / d,   rstd = 1 / sqrt(sum((x - mean)^2) / d + epsilon),
//                                    y_j = (x_j - mean) * rstd * gamma_j + beta_j
// Backward, with xhat_j = (x_j - mean) * rstd and g_j = dy_j * gamma_j:
//   dx_j = rstd * (g_j - mean(g) - xhat_j * mean(g * xhat))           (per row)
//   dgamma_j = sum over rows of dy_j * xhat_j,  dbeta_j = sum of dy_j  (per column, through blocks of
//   kLayerNormRowsPerBlock rows: each block summed in row order from +0, the blocks' sums added in block order)
#pragma once

#include <cstdint>

#include "host_device.h"
#include "lane_sum.h"

namespace mixtrain::ops::shared {

// Rows per block of the backward's column sums. Part of the result's bits: both backends use this value.
constexpr int64_t kLayerNormRowsPerBlock = 64;

// 1 / d in float32, the factor every mean is taken with.
MIXTRAIN_HOST_DEVICE inline float layer_norm_inv_d(int64_t d) { return div_rn(1.0f, static_cast<float>(d)); }

struct LayerNormStats {
  float mean;
  float rstd;
};

// The statistics from the row's sums: mean = sum * inv_d, and rstd from the sum of squared deviations.
MIXTRAIN_HOST_DEVICE inline float layer_norm_mean(float sum, float inv_d) { return mul_rn(sum, inv_d); }
MIXTRAIN_HOST_DEVICE inline float layer_norm_square_deviation(float x, float mean) {
  const float t = sub_rn(x, mean);
  return mul_rn(t, t);
}
MIXTRAIN_HOST_DEVICE inline float layer_norm_rstd(float square_deviations, float inv_d, float epsilon) {
  return div_rn(1.0f, sqrt_rn(add_rn(mul_rn(square_deviations, inv_d), epsilon)));
}

// A row's mean and rstd in two passes (the second sums squared deviations from the mean, so a large mean does not
// cancel the variance away), each sum in the lanes' order.
template <typename Row>
MIXTRAIN_HOST_DEVICE inline LayerNormStats layer_norm_row_stats(const Row& x, int64_t d, float inv_d, float epsilon) {
  const float mean = layer_norm_mean(lane_sum(d, [&](int64_t j) { return x[j]; }), inv_d);
  const float ss = lane_sum(d, [&](int64_t j) { return layer_norm_square_deviation(x[j], mean); });
  return {mean, layer_norm_rstd(ss, inv_d, epsilon)};
}

// One output element, before its rounding into the output dtype.
MIXTRAIN_HOST_DEVICE inline float layer_norm_value(float x, float mean, float rstd, float gamma, float beta) {
  return add_rn(mul_rn(mul_rn(sub_rn(x, mean), rstd), gamma), beta);
}

MIXTRAIN_HOST_DEVICE inline float layer_norm_xhat(float x, float mean, float rstd) {
  return mul_rn(sub_rn(x, mean), rstd);
}

MIXTRAIN_HOST_DEVICE inline float layer_norm_g(float dy, float gamma) { return mul_rn(dy, gamma); }

// Term j of the backward's second row sum (the first's is g_j); both sums run in the lanes' order.
MIXTRAIN_HOST_DEVICE inline float layer_norm_gx(float g, float xhat) { return mul_rn(g, xhat); }

// dx_j from g_j, xhat_j and the row's means of g and g * xhat (sums times inv_d).
MIXTRAIN_HOST_DEVICE inline float layer_norm_dx(float g, float xhat, float rstd, float mean_g, float mean_gx) {
  return mul_rn(rstd, sub_rn(sub_rn(g, mean_g), mul_rn(xhat, mean_gx)));
}

// Adds one row's terms to a column's running dgamma and dbeta.
MIXTRAIN_HOST_DEVICE inline void layer_norm_column_step(float& dgamma, float& dbeta, float dy, float xhat) {
  dgamma = add_rn(dgamma, mul_rn(dy, xhat));
  dbeta = add_rn(dbeta, dy);
}

// Column j's dgamma and dbeta over rows [r0, r1), from +0 in row order: one block's partial sums. x and dy are
// (rows, d) read through flat element accessors; mean and rstd are the saved (rows,) statistics.
template <typename X, typename Dy>
MIXTRAIN_HOST_DEVICE inline void layer_norm_column_block(const X& x, const Dy& dy, const float* mean,
                                                         const float* rstd, int64_t d, int64_t j, int64_t r0,
                                                         int64_t r1, float& dgamma, float& dbeta) {
  dgamma = 0.0f;
  dbeta = 0.0f;
  for (int64_t r = r0; r < r1; ++r)
    layer_norm_column_step(dgamma, dbeta, dy[r * d + j], layer_norm_xhat(x[r * d + j], mean[r], rstd[r]));
}

}  // namespace mixtrain::ops::shared
