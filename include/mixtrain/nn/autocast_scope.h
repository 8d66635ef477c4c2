// The autocast scope a layer puts in force while its call() runs (autograd/autocast.h): the differentiable
// functions then read the layer's floating variables in its compute dtype, through the same cached,
// differentiable cast as Layer::autocast(w), as Keras reads a layer's variables inside call().
//
// Active only when the layer autocasts (Layer::autocasts_variables(); normalization layers keep float32) and
// its compute dtype differs from its variable dtype; otherwise it suspends any outer scope for the call, so a
// sublayer never reads its caller's variables in another dtype. Only this layer's own variables are read
// cast; a sublayer's variables are cast by the sublayer's own scope when it is called.
#pragma once

#include "mixtrain/autograd/autocast.h"

namespace mixtrain {

class Layer;

class LayerAutocastScope final : public AutocastScope {
 public:
  explicit LayerAutocastScope(Layer& layer);
  Var read(const Var& v) override;

 private:
  Layer& layer_;
};

}  // namespace mixtrain
