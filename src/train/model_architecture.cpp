// A model's layers and, for a functional model, its graph of layer calls, as JSON and back.
#include <algorithm>
#include <map>

#include "mixtrain/nn/layer_registry.h"
#include "model_config.h"

namespace mixtrain::detail {

namespace {

Json shape_json(const Shape& s) {
  Json out = Json::array();
  for (int64_t d : s.dims()) out.push_back(d);
  return out;
}

Shape shape_from(const Json& j) {
  std::vector<int64_t> dims;
  for (const Json& d : j.as_array()) dims.push_back(d.as_int64());
  return Shape(std::move(dims));
}

// The name a layer is saved under: its registered name, else its class_name() for the loading program to register,
// unless another type holds that name (a subclass of Dense would load as a Dense).
Json layer_entry(const Layer& layer) {
  std::optional<std::string> registered = registered_layer_name(layer);
  if (!registered) {
    const std::vector<std::string> taken = registered_layer_names();
    MIXTRAIN_CHECK(std::find(taken.begin(), taken.end(), layer.class_name()) == taken.end(),
                   "save_model: layer '" << layer.name() << "' says it is a '" << layer.class_name()
                                         << "' but its type is not the one registered under that name; register it "
                                            "under a name of its own (register_layer<MyLayer>(\"my_package>MyLayer\"))");
  }
  return Json::object({{"class_name", layer.class_name()},
                       {"registered_name", registered ? *registered : layer.class_name()},
                       {"config", layer.get_config()}});
}

// The graph's calls in an order where each follows its inputs: Inputs as {"input": {...}}, layer calls as
// {"layer": index in model.layers(), "inputs": [[node, output index], ...]}.
class GraphWriter {
 public:
  explicit GraphWriter(const Model& model) {
    for (size_t i = 0; i < model.layers().size(); ++i) layer_index_[model.layers()[i].get()] = i;
  }
  int64_t visit(const SymbolicTensor& t) {
    const SymbolicNode* node = t.node();
    if (auto it = node_id_.find(node); it != node_id_.end()) return it->second;
    Json entry;
    if (t.is_input()) {
      entry["input"] = Json::object({{"name", t.name()}, {"shape", shape_json(t.shape())},
                                     {"dtype", dtype_name(t.dtype())}});
    } else {
      Json inputs = Json::array();
      for (const SymbolicTensor& in : t.inputs()) inputs.push_back(Json::array({visit(in), in.output_index()}));
      entry["layer"] = static_cast<int64_t>(layer_index_.at(t.layer()));
      entry["inputs"] = inputs;
    }
    nodes_.push_back(entry);
    return node_id_[node] = static_cast<int64_t>(nodes_.size()) - 1;
  }
  Json nodes() const {
    Json out = Json::array();
    for (const Json& n : nodes_) out.push_back(n);
    return out;
  }

 private:
  std::map<const Layer*, size_t> layer_index_;
  std::map<const SymbolicNode*, int64_t> node_id_;
  std::vector<Json> nodes_;
};

// One node's call on the rebuilt symbolic tensors: every output of it.
std::vector<SymbolicTensor> call_node(Layer& layer, const std::vector<SymbolicTensor>& inputs) {
  const bool one = inputs.size() == 1 && layer.num_inputs() == 1;
  if (layer.num_outputs() > 1) return one ? layer.outputs(inputs[0]) : layer.outputs(inputs);
  return {one ? layer(inputs[0]) : layer(inputs)};
}

std::unique_ptr<Model> graph_from(const Json& a, const std::vector<std::shared_ptr<Layer>>& layers, uint64_t seed) {
  std::vector<std::vector<SymbolicTensor>> outputs;  // per node
  const auto tensor = [&](const Json& ref) {
    const auto node = static_cast<size_t>(ref.at(size_t{0}).as_int64());
    const auto index = static_cast<size_t>(ref.at(size_t{1}).as_int64());
    MIXTRAIN_CHECK(node < outputs.size() && index < outputs[node].size(),
                   "model architecture: a node refers to output " << index << " of node " << node
                                                                  << ", which does not precede it");
    return outputs[node][index];
  };
  for (const Json& n : a.at("nodes").as_array()) {
    if (const Json* in = n.find("input")) {
      outputs.push_back({Input(shape_from(in->at("shape")), parse_dtype(in->at("dtype").as_string()),
                               in->at("name").as_string())});
      continue;
    }
    const auto index = static_cast<size_t>(n.at("layer").as_int64());
    MIXTRAIN_CHECK(index < layers.size(), "model architecture: a node calls layer " << index << " of "
                                                                                   << layers.size());
    std::vector<SymbolicTensor> inputs;
    for (const Json& ref : n.at("inputs").as_array()) inputs.push_back(tensor(ref));
    outputs.push_back(call_node(*layers[index], inputs));
  }
  std::vector<SymbolicTensor> ins, outs;
  for (const Json& id : a.at("inputs").as_array()) ins.push_back(tensor(Json::array({id, 0})));
  for (const Json& ref : a.at("outputs").as_array()) outs.push_back(tensor(ref));
  return std::make_unique<Model>(std::move(ins), std::move(outs), a.at("name").as_string(), seed);
}

}  // namespace

Json model_architecture(const Model& model) {
  Json layers = Json::array();
  for (const auto& l : model.layers()) layers.push_back(layer_entry(*l));
  Json a = Json::object({{"class_name", model.is_functional() ? "Functional" : "Sequential"},
                         {"name", model.name()},
                         {"layers", layers}});
  if (!model.is_functional()) return a;
  GraphWriter graph(model);
  Json inputs = Json::array(), outputs = Json::array();
  for (const SymbolicTensor& t : model.graph_inputs()) inputs.push_back(graph.visit(t));
  for (const SymbolicTensor& t : model.graph_outputs())
    outputs.push_back(Json::array({graph.visit(t), t.output_index()}));
  a["nodes"] = graph.nodes();
  a["inputs"] = inputs;
  a["outputs"] = outputs;
  return a;
}

std::unique_ptr<Model> model_from_architecture(const Json& a, uint64_t seed) {
  const std::string& kind = a.at("class_name").as_string();
  MIXTRAIN_CHECK(kind == "Sequential" || kind == "Functional",
                 "model architecture: class_name '" << kind << "' is neither Sequential nor Functional");
  std::vector<std::shared_ptr<Layer>> layers;
  for (const Json& entry : a.at("layers").as_array()) {
    const Json& config = entry.at("config");
    try {
      layers.push_back(layer_from_config(entry.at("registered_name").as_string(), config));
    } catch (const Error& e) {
      const Json* name = config.is_object() ? config.find("name") : nullptr;
      MIXTRAIN_FAIL(kInvalidInput, "layer '" << (name && name->is_string() ? name->as_string() : "?") << "': "
                                             << e.message(),
                    e.hint());
    }
  }
  if (kind == "Functional") return graph_from(a, layers, seed);
  auto model = std::make_unique<Model>(a.at("name").as_string(), seed);
  for (auto& l : layers) model->add(l);
  return model;
}

}  // namespace mixtrain::detail
