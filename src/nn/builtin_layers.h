// The built-in layers' entries of the layer registry (nn/layer_registry.h), added on its first use.
#pragma once

#include "mixtrain/nn/layer_registry.h"

namespace mixtrain::detail {

// Calls add(registered name, type, factory) once for every built-in layer; defined beside their get_config()s.
using AddLayerFactory = void (*)(const std::string&, std::type_index, LayerFactory);
void register_builtin_layers(AddLayerFactory add);

}  // namespace mixtrain::detail
