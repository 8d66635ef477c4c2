// The data set of the train tests: three Gaussian blobs in 8 dimensions, separable, so a small MLP must reach
// high accuracy; sample i has label i % 3, and one seed always gives the same samples.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "mixtrain/core/random.h"
#include "mixtrain/core/tensor.h"

namespace mixtrain::train_test {

inline std::pair<Tensor, Tensor> blobs(int64_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> x(static_cast<size_t>(n * 8));
  std::vector<int32_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    y[static_cast<size_t>(i)] = static_cast<int32_t>(i % 3);
    for (int64_t j = 0; j < 8; ++j)
      x[static_cast<size_t>(i * 8 + j)] = 0.7f * r.normal() + (j % 3 == y[static_cast<size_t>(i)] ? 2.0f : 0.0f);
  }
  return {Tensor::from_floats({n, 8}, x), Tensor::from_ints({n}, y)};
}

}  // namespace mixtrain::train_test
