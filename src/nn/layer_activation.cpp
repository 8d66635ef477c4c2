#include "mixtrain/nn/layer_activation.h"

#include "mixtrain/core/error.h"

namespace mixtrain {

LayerActivation parse_layer_activation(std::string_view name) {
  if (name == "softmax") return {ops::Activation::kLinear, true};
  if (name.empty() || name == "linear" || name == "none" || name == "relu" || name == "gelu" || name == "sigmoid" ||
      name == "tanh")
    return {ops::parse_activation(name), false};
  MIXTRAIN_FAIL(kInvalidInput, "unknown activation '" << name << "'",
                "valid activations: linear, relu, gelu, sigmoid, tanh, softmax");
}

const char* layer_activation_name(const LayerActivation& a) {
  return a.softmax ? "softmax" : ops::activation_name(a.elementwise);
}

Var after_product(const Var& y, const LayerActivation& a) { return a.softmax ? softmax(y) : y; }

}  // namespace mixtrain
