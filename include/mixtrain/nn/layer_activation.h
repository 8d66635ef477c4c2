// A layer's `activation` argument (Dense, Conv2D, Activation), by Keras' names: an element-wise function, which
// the layer's kernel applies inside its product where it can (relu, gelu), or "softmax" over the last axis, the most
// common output layer in Keras (`Dense(10, "softmax")`), which needs whole rows and so runs after the product.
#pragma once

#include <string_view>

#include "mixtrain/autograd/functions.h"
#include "mixtrain/ops/elementwise.h"

namespace mixtrain {

struct LayerActivation {
  ops::Activation elementwise = ops::Activation::kLinear;
  bool softmax = false;  // then elementwise is kLinear
};

// "linear" (also "" and "none"), "relu", "gelu", "sigmoid", "tanh", "softmax"; Error listing them otherwise.
LayerActivation parse_layer_activation(std::string_view name);
// The name parse_layer_activation() reads back to `a` ("softmax", "relu", ...).
const char* layer_activation_name(const LayerActivation& a);

// The part of the activation that follows the layer's product: softmax over the last axis when asked, else y.
// Softmax, a numerically sensitive op, sums its rows in float32 under every policy (ops/softmax.h).
Var after_product(const Var& y, const LayerActivation& a);

}  // namespace mixtrain
