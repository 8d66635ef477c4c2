// LayerAutocastScope (nn/layer.h): how a layer's call() reads the layer's own variables.
#include "mixtrain/nn/layer.h"

namespace mixtrain {

LayerAutocastScope::LayerAutocastScope(Layer& layer)
    : AutocastScope(layer.autocasts_variables() && layer.compute_dtype() != layer.variable_dtype()),
      layer_(layer) {}

Var LayerAutocastScope::read(const Var& v) {
  // Most operands are activations, already in the compute dtype: one comparison and they pass.
  if (!v.defined() || !is_float(v.dtype()) || v.dtype() == layer_.compute_dtype()) return v;
  for (const Var& w : layer_.weights())
    if (w.same(v)) return layer_.autocast(v);  // a new recorded read each time, as an explicit autocast(w)
  return v;
}

}  // namespace mixtrain
