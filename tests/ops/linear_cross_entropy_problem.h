// The inputs of the linear + cross-entropy tests (linear_cross_entropy_test.cpp, linear_cross_entropy_rows_test.cpp):
// x (n, d) in [-2, 2], w (d, v) in [-1, 1] in dtype dt, a float32 bias in [-1, 1], and n labels below v.
#pragma once

#include <cstdint>
#include <vector>

#include "op_test_util.h"

namespace mixtrain::ops::testing {

struct LinearCrossEntropyProblem {
  Tensor x, w, bias, labels;
};

// x, w and bias from seed, seed + 1 and seed + 2; the labels drawn from label_seed.
inline LinearCrossEntropyProblem make_linear_cross_entropy_problem(int64_t n, int64_t d, int64_t v, DType dt,
                                                                   uint64_t seed, uint64_t label_seed) {
  Rng r(label_seed);
  std::vector<int32_t> l(static_cast<size_t>(n));
  for (int32_t& y : l) y = static_cast<int32_t>(r.next_u64() % static_cast<uint64_t>(v));
  return {random_tensor({n, d}, seed, dt, -2, 2), random_tensor({d, v}, seed + 1, dt, -1, 1),
          random_tensor({v}, seed + 2, DType::kFloat32, -1, 1), Tensor::from_ints({n}, l)};
}

}  // namespace mixtrain::ops::testing
