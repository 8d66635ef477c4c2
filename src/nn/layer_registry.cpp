#include "mixtrain/nn/layer_registry.h"

#include <map>
#include <mutex>

#include "builtin_layers.h"
#include "mixtrain/core/error.h"

namespace mixtrain {

namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, std::pair<std::type_index, LayerFactory>> by_name;
  std::map<std::type_index, std::string> by_type;
};

Registry& registry() {
  static Registry r;
  return r;
}

void add_entry(const std::string& registered_name, std::type_index type, LayerFactory factory) {
  MIXTRAIN_CHECK(!registered_name.empty() && factory, "register_layer: empty name or factory");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto by_name = r.by_name.find(registered_name);
  auto by_type = r.by_type.find(type);
  if (by_name != r.by_name.end() && by_name->second.first == type) return;  // the same registration again
  MIXTRAIN_CHECK(by_name == r.by_name.end(), "register_layer: the name '" << registered_name << "' is taken by type "
                                                 << by_name->second.first.name() << "; give " << type.name()
                                                 << " another name (e.g. \"my_package>" << registered_name << "\")");
  MIXTRAIN_CHECK(by_type == r.by_type.end(), "register_layer: type " << type.name() << " is already registered as '"
                                                 << by_type->second << "', not '" << registered_name << "'");
  r.by_name.emplace(registered_name, std::make_pair(type, std::move(factory)));
  r.by_type.emplace(type, registered_name);
}

// The built-in layers join on the registry's first use, so no static initialisation order matters.
Registry& registry_with_builtins() {
  static std::once_flag once;
  std::call_once(once, [] { detail::register_builtin_layers(&add_entry); });
  return registry();
}

}  // namespace

void register_layer_factory(const std::string& registered_name, std::type_index type, LayerFactory factory) {
  registry_with_builtins();
  add_entry(registered_name, type, std::move(factory));
}

std::optional<std::string> registered_layer_name(const Layer& layer) {
  Registry& r = registry_with_builtins();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.by_type.find(typeid(layer));
  if (it == r.by_type.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> registered_layer_names() {
  Registry& r = registry_with_builtins();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [name, entry] : r.by_name) names.push_back(name);
  return names;
}

std::shared_ptr<Layer> layer_from_config(const std::string& registered_name, const Json& config) {
  LayerFactory factory;
  {
    Registry& r = registry_with_builtins();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.by_name.find(registered_name);
    if (it == r.by_name.end()) {
      MIXTRAIN_FAIL(kInvalidInput,
                    "unknown layer class '" << registered_name << "': no layer is registered under that name",
                    "register the class before loading, e.g. MIXTRAIN_REGISTER_LAYER(MyLayer, \"" + registered_name +
                        "\") or register_layer<MyLayer>(\"" + registered_name +
                        "\") (nn/layer_registry.h), with a static from_config(const Json&)");
    }
    factory = it->second.second;
  }
  try {
    std::shared_ptr<Layer> layer = factory(config);
    MIXTRAIN_CHECK(layer != nullptr, "the factory returned no layer");
    return layer;
  } catch (const Error& e) {
    MIXTRAIN_FAIL(kInvalidInput, "layer class '" << registered_name << "', config " << config.dump() << ": "
                                                 << e.message(),
                  e.hint());
  }
}

LayerBaseArgs layer_base_args(const Json& config) {
  MIXTRAIN_CHECK(config.is_object(), "a layer configuration must be a JSON object, got " << config.type_name());
  LayerBaseArgs args;
  args.name = config.at("name").as_string();
  args.dtype = dtype_arg(config.at("dtype").as_string());
  return args;
}

}  // namespace mixtrain
