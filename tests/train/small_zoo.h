// The registered models in small, with data they can learn: for tests that train one model on two devices.
#pragma once

#include <string>
#include <vector>

#include "mixtrain/core/random.h"
#include "mixtrain/core/tensor.h"
#include "mixtrain/train/run.h"

namespace mixtrain::train_test {

struct SmallZoo {
  RunConfig cfg;  // the model, the policy, seed 3, one block or hidden layer of `width`
  bool text = false;
  int64_t features = 0, classes = 0;
  std::vector<int64_t> sample_shape;  // {8, 8} images, or 8 token ids
  Tensor x, y;                        // n samples
};

// n samples for cfg.model: 8x8 images in 3 classes (a class's pixels brighter in one band of rows), or sequences of 8
// ids among 11 tokens labelled with the next id (the transformer).
inline SmallZoo small_zoo(const std::string& model, const std::string& policy, int64_t width, int64_t n) {
  SmallZoo z;
  z.cfg.model = model;
  z.cfg.policy = policy;
  z.cfg.seed = 3;
  z.cfg.hidden = {width};
  z.cfg.width = width;
  z.cfg.num_heads = 2;
  z.cfg.num_layers = 1;
  z.cfg.context_length = 8;
  z.text = model == "transformer";
  z.features = z.text ? 8 : 64;
  z.classes = z.text ? 11 : 3;
  z.sample_shape = z.text ? std::vector<int64_t>{8} : std::vector<int64_t>{8, 8};
  Rng r(5);
  if (z.text) {
    std::vector<int32_t> ids(static_cast<size_t>(n * z.features)), next(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(r.below(z.classes));
    for (size_t i = 0; i < ids.size(); ++i) next[i] = ids[(i + 1) % ids.size()];
    z.x = Tensor::from_ints({n, z.features}, ids);
    z.y = Tensor::from_ints({n, z.features}, next);
  } else {
    std::vector<float> pixels(static_cast<size_t>(n * z.features));
    std::vector<int32_t> labels(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      labels[static_cast<size_t>(i)] = static_cast<int32_t>(i % 3);
      for (int64_t j = 0; j < z.features; ++j)
        pixels[static_cast<size_t>(i * z.features + j)] = r.uniform() + (j / 8 % 3 == i % 3 ? 0.5f : 0.0f);
    }
    z.x = Tensor::from_floats({n, z.features}, pixels);
    z.y = Tensor::from_ints({n}, labels);
  }
  return z;
}

}  // namespace mixtrain::train_test
