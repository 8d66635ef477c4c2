// The tour's data set, as sklearn.datasets.make_blobs(n, n_features=8, centers=3) would give it: three
// Gaussian blobs, sample i in class i % 3, one seed always giving the same samples.
#pragma once

#include <utility>
#include <vector>

#include "mixtrain/core/random.h"
#include "mixtrain/core/tensor.h"

inline std::pair<mixtrain::Tensor, mixtrain::Tensor> make_blobs(int64_t n, uint64_t seed) {
  mixtrain::Rng rng(seed);
  std::vector<float> x;
  std::vector<int32_t> y;
  for (int64_t i = 0; i < n; ++i) {
    y.push_back(static_cast<int32_t>(i % 3));
    for (int j = 0; j < 8; ++j) x.push_back(0.8f * rng.normal() + (j % 3 == y.back() ? 2.0f : 0.0f));
  }
  return {mixtrain::Tensor::from_floats({n, 8}, x), mixtrain::Tensor::from_ints({n}, y)};
}
