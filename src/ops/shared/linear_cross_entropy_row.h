// The chunked linear + cross-entropy's row and column steps (ops/linear_cross_entropy.h), for host and device: the
// GPU kernels (cuda/linear_cross_entropy.cu) run them one thread per row (or per column), and a host loop over them
// (tests/ops/linear_cross_entropy_rows_test.cpp) gives the kernels' bits on the CPU, the logarithm aside (glibc's
// logf and CUDA's may differ in the last place).
//
// A row of float32 logits z (the chunk GEMM's, bias included) gives
//   arg-max   the first maximum, as the CPU kernel and the accuracy kernel take it
//   lse       max + log(sum e^(z - max)), float32, the sum in column order (shared/exp_poly.h's exponential, the
//             same bits on both sides, where the CPU kernel takes std::exp: its bits may differ by a unit)
//   loss      -(z[label] - lse), widened to double (the caller sums the rows in double, in row order)
//   dlogits   k (e^(z - lse) - onehot(label)) in place, k = seed / rows
// and dbias adds a column of the chunk's dlogits in row order onto the previous chunks' float32 sum, as the CPU
// kernel does (the same bits, given the same dlogits).
#pragma once

#include <cstdint>

#include "crossentropy_row.h"
#include "exp_poly.h"
#include "host_device.h"

namespace mixtrain::ops::shared {

struct LinearCrossEntropyRow {
  double loss;   // -log softmax(z)[label]
  bool correct;  // the row's first arg-max is its label
};

// One row of n logits z with its label in [0, n); with grad, z becomes the row's dlogits (factor k).
MIXTRAIN_HOST_DEVICE inline LinearCrossEntropyRow linear_cross_entropy_row(float* z, int64_t n, int64_t label,
                                                                           bool grad, float k) {
  float mx = -INFINITY;
  int64_t arg = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (z[j] > z[arg]) arg = j;
    mx = max_f32(mx, z[j]);
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) sum = add_rn(sum, expf_poly::exp(sub_rn(z[j], mx)));
  const float lse = log_sum_exp(mx, sum);
  const LinearCrossEntropyRow r{crossentropy_term(1.0f, log_softmax_value(z[label], lse)), arg == label};
  if (grad)
    for (int64_t j = 0; j < n; ++j)
      z[j] = mul_rn(k, sub_rn(expf_poly::exp(sub_rn(z[j], lse)), j == label ? 1.0f : 0.0f));
  return r;
}

// Column j of a chunk's (rows, n) float32 dlogits g summed in row order onto start (0 for the first chunk).
MIXTRAIN_HOST_DEVICE inline float linear_cross_entropy_bias_grad(const float* g, int64_t rows, int64_t n, int64_t j,
                                                                 float start) {
  float s = start;
  for (int64_t i = 0; i < rows; ++i) s = add_rn(s, g[i * n + j]);
  return s;
}

// The gradient's factor k = seed / rows (rows 0 counts as 1), in float32 as the CPU kernel rounds it.
MIXTRAIN_HOST_DEVICE inline float linear_cross_entropy_grad_scale(float seed, int64_t rows) {
  return div_rn(seed, static_cast<float>(rows > 1 ? rows : 1));
}

}  // namespace mixtrain::ops::shared
