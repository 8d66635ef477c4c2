// The element and row arithmetic of mean_squared_error and its gradient, sum / mean, and
// sparse_categorical_accuracy (ops/losses.h), for host and device. The CPU kernels (cpu/losses.cpp) widen every
// element to float32, add double terms from 0 in index order and round the total once into the float32 result;
// these functions are their operations in their order, so on the host they give the CPU's bits
// (tests/ops/cuda_shared_losses_test.cpp). A GPU kernel adds the same double terms in its own fixed order, which
// can move the double total in its last places, and only exceptionally the float32 result by one unit.
//
// The arg-max is the CPU's std::max_element over a float32 row: the first index of the largest value, where a
// NaN never replaces the running maximum but a NaN at index 0 is never replaced either (every comparison with it
// is false). ArgMax states combine in any grouping and order to that same index, so a warp can scan a row in
// strided slices and merge them.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace mixtrain::ops::shared {

// One element's squared error in double: (p - t)^2, the difference taken in double.
MIXTRAIN_HOST_DEVICE inline double mse_term(float p, float t) {
  const double d = dadd_rn(static_cast<double>(p), -static_cast<double>(t));
  return dmul_rn(d, d);
}

// The float32 result of a double sum over n elements: the mean (0 for no elements), or the sum itself.
MIXTRAIN_HOST_DEVICE inline float float_total(double sum, int64_t n, bool mean) {
  if (!mean) return static_cast<float>(sum);
  return n ? static_cast<float>(ddiv_rn(sum, static_cast<double>(n))) : 0.0f;
}

// The mean squared error's gradient factor 2 dloss / n (n = 0 counts as 1), and one element's gradient.
MIXTRAIN_HOST_DEVICE inline float mse_grad_scale(float dloss, int64_t n) {
  return div_rn(mul_rn(2.0f, dloss), static_cast<float>(n > 1 ? n : 1));
}
MIXTRAIN_HOST_DEVICE inline float mse_grad(float k, float p, float t) { return mul_rn(k, sub_rn(p, t)); }

// One weight's regularization penalty in double: l1 |w| + (l2 w) w, and its gradient times the upstream seed in
// float32: seed (l1 sign(w) + (2 l2) w). sign(NaN) is 0, as (w > 0) - (w < 0) makes it.
MIXTRAIN_HOST_DEVICE inline double penalty_term(float w, float l1, float l2) {
  const double a = static_cast<double>(w < 0.0f ? -w : w);
  return dadd_rn(dmul_rn(static_cast<double>(l1), a), dmul_rn(dmul_rn(static_cast<double>(l2), w), w));
}
MIXTRAIN_HOST_DEVICE inline float penalty_grad(float seed, float w, float l1, float l2) {
  const float sign = static_cast<float>((w > 0.0f) - (w < 0.0f));
  return mul_rn(seed, add_rn(mul_rn(l1, sign), mul_rn(mul_rn(2.0f, l2), w)));
}

// The arg-max of the elements seen so far that are not NaN: index -1 while there is none.
struct ArgMax {
  float value;
  int64_t index;
};
constexpr ArgMax kNoArgMax{0.0f, -1};

// State a after also seeing element j of value v: a larger value wins, an equal one (as -0 and +0 are) only with
// a smaller index, a NaN never.
MIXTRAIN_HOST_DEVICE inline ArgMax argmax_take(ArgMax a, float v, int64_t j) {
  if (is_nan_f32(v)) return a;
  if (a.index < 0 || a.value < v || (!(v < a.value) && j < a.index)) return ArgMax{v, j};
  return a;
}
// Two states of disjoint sets of elements, merged (commutative and associative).
MIXTRAIN_HOST_DEVICE inline ArgMax argmax_merge(ArgMax a, ArgMax b) {
  return b.index < 0 ? a : argmax_take(a, b.value, b.index);
}
// The row's arg-max from the state of all its elements and its element 0 (max_element's index: 0 when element 0
// is NaN, when every element is NaN, and for an empty row).
MIXTRAIN_HOST_DEVICE inline int64_t argmax_index(ArgMax a, float first) {
  return is_nan_f32(first) || a.index < 0 ? 0 : a.index;
}

}  // namespace mixtrain::ops::shared
