// The built-in layers' entries of the layer registry (nn/layer_registry.h), added on its first use.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <typeindex>

namespace mixtrain {
class Json;
class Layer;
}  // namespace mixtrain

namespace mixtrain::detail {

// Calls add(registered name, type, factory) once for every built-in layer; defined beside their get_config()s. The
// factory's type is LayerFactory's (nn/layer_registry.h), spelled out so this header does not include the registry.
using AddLayerFactory = void (*)(const std::string&, std::type_index,
                                 std::function<std::shared_ptr<Layer>(const Json&)>);
void register_builtin_layers(AddLayerFactory add);

}  // namespace mixtrain::detail
