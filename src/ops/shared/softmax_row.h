// Softmax and log-softmax over one row, in float32, written once for the CPU reference and the GPU kernels.
// The row functions follow the CPU kernel's (cpu/softmax.cpp) operation order, so on the host they give its bits;
// a GPU kernel combines the same element steps with a parallel max and sum, whose different summation order
// (and the device's expf and logf) moves results by a few float32 units.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace mixtrain::ops::shared {

// Stable form: every exponent is taken of x - max(row) <= 0, so no term overflows.
MIXTRAIN_HOST_DEVICE inline float softmax_term(float x, float row_max) { return exp_f32(sub_rn(x, row_max)); }
// log(sum(exp(x))) from the row's max and its sum of softmax_term.
MIXTRAIN_HOST_DEVICE inline float log_sum_exp(float row_max, float term_sum) {
  return add_rn(row_max, log_f32(term_sum));
}
MIXTRAIN_HOST_DEVICE inline float softmax_value(float term, float term_sum) { return div_rn(term, term_sum); }
MIXTRAIN_HOST_DEVICE inline float log_softmax_value(float x, float lse) { return sub_rn(x, lse); }

// out = softmax(in) (log_softmax when log) over n elements; out may not alias in.
MIXTRAIN_HOST_DEVICE inline void softmax_row(const float* in, float* out, int64_t n, bool log) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) mx = max_f32(mx, in[j]);
  float sum = 0;
  if (log) {
    for (int64_t j = 0; j < n; ++j) sum = add_rn(sum, softmax_term(in[j], mx));
    const float lse = log_sum_exp(mx, sum);
    for (int64_t j = 0; j < n; ++j) out[j] = log_softmax_value(in[j], lse);
  } else {
    for (int64_t j = 0; j < n; ++j) sum = add_rn(sum, out[j] = softmax_term(in[j], mx));
    for (int64_t j = 0; j < n; ++j) out[j] = softmax_value(out[j], sum);
  }
}

// Backward element steps from the saved output s and the incoming gradient d:
//   softmax:      dx = s * (d - sum(d * s))
//   log_softmax:  dx = d - exp(s) * sum(d)
MIXTRAIN_HOST_DEVICE inline float softmax_grad(float s, float d, float dot) { return mul_rn(s, sub_rn(d, dot)); }
MIXTRAIN_HOST_DEVICE inline float log_softmax_grad(float s, float d, float d_sum) {
  return sub_rn(d, mul_rn(exp_f32(s), d_sum));
}

// dx over one row from the saved output s (of softmax, or of log_softmax when log) and dy.
MIXTRAIN_HOST_DEVICE inline void softmax_backward_row(const float* s, const float* d, float* out, int64_t n, bool log) {
  float acc = 0;
  if (log) {
    for (int64_t j = 0; j < n; ++j) acc = add_rn(acc, d[j]);
    for (int64_t j = 0; j < n; ++j) out[j] = log_softmax_grad(s[j], d[j], acc);
  } else {
    for (int64_t j = 0; j < n; ++j) acc = add_rn(acc, mul_rn(d[j], s[j]));
    for (int64_t j = 0; j < n; ++j) out[j] = softmax_grad(s[j], d[j], acc);
  }
}

}  // namespace mixtrain::ops::shared
