// RMS normalization's row and column arithmetic (the op: ops/rms_norm.h), float32 whatever the storage dtype,
// written once for the CPU kernel (cpu/rms_norm.cpp) and the GPU kernel (cuda/rms_norm.cu). The orders are layer
// normalization's (layer_norm_row.h): a row's sums in the lanes' order of lane_sum.h, the backward's column sums
// from +0 one row after another in blocks of kLayerNormRowsPerBlock rows, the blocks added in block order.
//
// Forward, per row x of length d:   rstd = 1 / sqrt(sum(x^2) / d + epsilon),   y_j = x_j * rstd * scale_j
// Backward, with xhat_j = x_j * rstd and g_j = dy_j * scale_j:
//   dx_j = rstd * (g_j - xhat_j * mean(g * xhat))     (per row)
//   dscale_j = sum over rows of dy_j * xhat_j          (per column, through the blocks)
#pragma once

#include <cstdint>

#include "layer_norm_row.h"

namespace mixtrain::ops::shared {

MIXTRAIN_HOST_DEVICE inline float rms_norm_square(float x) { return mul_rn(x, x); }

// A row's rstd from one pass of squares in the lanes' order.
template <typename Row>
MIXTRAIN_HOST_DEVICE inline float rms_norm_row_rstd(const Row& x, int64_t d, float inv_d, float epsilon) {
  return layer_norm_rstd(lane_sum(d, [&](int64_t j) { return rms_norm_square(x[j]); }), inv_d, epsilon);
}

MIXTRAIN_HOST_DEVICE inline float rms_norm_xhat(float x, float rstd) { return mul_rn(x, rstd); }

// One output element, before its rounding into the output dtype.
MIXTRAIN_HOST_DEVICE inline float rms_norm_value(float x, float rstd, float scale) {
  return mul_rn(rms_norm_xhat(x, rstd), scale);
}

// dx_j from g_j = dy_j * scale_j (layer_norm_g), xhat_j and the row's mean of g * xhat (its sum times inv_d).
MIXTRAIN_HOST_DEVICE inline float rms_norm_dx(float g, float xhat, float rstd, float mean_gx) {
  return mul_rn(rstd, sub_rn(g, mul_rn(xhat, mean_gx)));
}

// Column j's dscale over rows [r0, r1), from +0 in row order: one block's partial sum. x and dy are (rows, d) read
// through flat element accessors; rstd is the saved (rows,) statistic.
template <typename X, typename Dy>
MIXTRAIN_HOST_DEVICE inline float rms_norm_column_block(const X& x, const Dy& dy, const float* rstd, int64_t d,
                                                        int64_t j, int64_t r0, int64_t r1) {
  float s = 0.0f;
  for (int64_t r = r0; r < r1; ++r) s = add_rn(s, mul_rn(dy[r * d + j], rms_norm_xhat(x[r * d + j], rstd[r])));
  return s;
}

}  // namespace mixtrain::ops::shared
