// The layer registry: how load_model (train/model_file.h) rebuilds a layer from the configuration a saved file holds,
// without the code that built the model, as Keras' register_keras_serializable. Every built-in layer is registered
// under its class name ("Dense", "Conv2D", ...); a custom layer registers itself under a name of its own, by
// convention "<package>>Class", before a model holding it is loaded:
//
//   class Scale : public Layer {
//    public:
//     explicit Scale(float factor, DTypeArg dtype = std::nullopt, const std::string& name = {});
//     Json get_config() const override {          // Layer's "name" and "dtype", plus the constructor's arguments
//       Json c = Layer::get_config();
//       c["factor"] = factor_;
//       return c;
//     }
//     static std::shared_ptr<Scale> from_config(const Json& c) {
//       const LayerBaseArgs base = layer_base_args(c);
//       return std::make_shared<Scale>(static_cast<float>(c.at("factor").as_number()), base.dtype, base.name);
//     }
//     ...
//   };
//   MIXTRAIN_REGISTER_LAYER(Scale, "my_package>Scale");   // at namespace scope, in the program's own source
//
// A layer is saved under the name its exact type was registered with (a subclass of Dense is not a Dense); a type
// registered under no name is saved by its class_name() and refused by load_model, naming it and how to register it.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <typeindex>
#include <vector>

#include "mixtrain/core/json.h"
#include "mixtrain/nn/layer.h"

namespace mixtrain {

// Builds a layer from its get_config() object.
using LayerFactory = std::function<std::shared_ptr<Layer>(const Json& config)>;

// Registers `type` under `registered_name`. Registering the same type under the same name again does nothing (a
// program may register in every place it needs the layer); a name already taken by another type, or a type already
// registered under another name, is an Error naming both.
void register_layer_factory(const std::string& registered_name, std::type_index type, LayerFactory factory);

// The usual form: L has `static std::shared_ptr<L> from_config(const Json&)`.
template <typename L>
void register_layer(const std::string& registered_name) {
  register_layer_factory(registered_name, typeid(L), [](const Json& config) -> std::shared_ptr<Layer> {
    return L::from_config(config);
  });
}

// Registers at program start-up from the program's own source file (a registration inside a static library is
// dropped by the linker when nothing else in its file is used: call register_layer<L>() from code that runs instead).
#define MIXTRAIN_REGISTER_LAYER_CAT2(a, b) a##b
#define MIXTRAIN_REGISTER_LAYER_CAT(a, b) MIXTRAIN_REGISTER_LAYER_CAT2(a, b)
#define MIXTRAIN_REGISTER_LAYER(Class, registered_name)                                         \
  [[maybe_unused]] static const bool MIXTRAIN_REGISTER_LAYER_CAT(mixtrain_registered_layer_, __LINE__) = \
      (::mixtrain::register_layer<Class>(registered_name), true)

// The name layer's exact type is registered under; nullopt when it is not registered.
std::optional<std::string> registered_layer_name(const Layer& layer);
// Every registered name, sorted.
std::vector<std::string> registered_layer_names();
// A new layer from a saved configuration. Error for an unknown name, saying how to register it; a factory's Error
// gets the registered name in front.
std::shared_ptr<Layer> layer_from_config(const std::string& registered_name, const Json& config);

// What every layer's configuration holds (Layer::get_config()): its name (explicit in the rebuilt layer) and its dtype
// policy's name, ready for a constructor's `dtype` and `name` arguments. Error when either is missing or invalid.
struct LayerBaseArgs {
  DTypeArg dtype;
  std::string name;
};
LayerBaseArgs layer_base_args(const Json& config);

}  // namespace mixtrain
