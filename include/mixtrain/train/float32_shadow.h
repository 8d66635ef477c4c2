// The float32 shadow of a network, as inspection and the recovery guard measure it: while a Float32Shadow lives,
// every layer computes in float32 (same weights) and `observer` sees each call, so the statistics tell what a
// 16-bit copy of each value would lose rather than values already broken. The destructor puts every layer's
// policy and the previous observer back, however the measurement ends.
#pragma once

#include <map>

#include "mixtrain/nn/network.h"

namespace mixtrain {

class Float32Shadow {
 public:
  Float32Shadow(Network& model, LayerObserver* observer);
  ~Float32Shadow();
  Float32Shadow(const Float32Shadow&) = delete;
  Float32Shadow& operator=(const Float32Shadow&) = delete;

  // The compute dtype a layer had before the shadow switched it.
  DType real_compute_dtype(const Layer& layer) const { return policies_.at(&layer).compute_dtype(); }

 private:
  Network& model_;
  LayerObserver* previous_observer_;
  std::map<const Layer*, DTypePolicy> policies_;
};

}  // namespace mixtrain
