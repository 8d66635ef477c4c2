// Whole-model files, as Keras' model.save() / keras.models.load_model(): one file holds the architecture (a stack's
// layers or a functional graph, each layer's configuration and dtype policy), the compile configuration (optimizer,
// loss, metrics) and the state (weights, optimizer slots, random streams), so another program rebuilds the model
// without the code that built it and goes on training where the saver stood.
//
//   model.save("mnist.model.safetensors");                   // or save_model(model, path)
//   std::unique_ptr<Model> m = load_model("mnist.model.safetensors");
//   m->predict(x);  m->fit(x, y, {.epochs = 2});
//
// The file is a checkpoint (train/checkpoint.h: safetensors, checksummed, written atomically) with three more
// __metadata__ entries, so load_checkpoint also reads it into a model built in code:
//   "model_format"        "mixtrain-model-1"
//   "model_architecture"  JSON: {"class_name": "Sequential" | "Functional", "name", "layers": [{"class_name",
//                         "registered_name", "config"}, ...]} in model order, config being Layer::get_config() (name,
//                         dtype policy, constructor arguments); a functional model adds "nodes" (each an Input
//                         {"input": {"name", "shape", "dtype"}} or a layer call {"layer": index, "inputs": [[node,
//                         output], ...]}, every node after those it reads), "inputs" (node indices) and "outputs"
//                         ([node, output] pairs)
//   "model_compile"       JSON: null, or {"optimizer": precision/optimizer_config.h's object or null (compiled for
//                         evaluation only), "loss": {"name", "from_logits"}, "metrics": [...]}
// Layers are rebuilt through the layer registry (nn/layer_registry.h): every built-in layer is there; a custom layer
// registers itself in the loading program (MIXTRAIN_REGISTER_LAYER) or load_model names it and says how.
#pragma once

#include <memory>
#include <string>

namespace mixtrain {

class Model;

inline constexpr const char* kModelFormat = "mixtrain-model-1";

// Writes the model to path (atomically, as save_checkpoint). The model must be built. Error, writing nothing, for a
// layer whose type is not the one registered under its class name (a subclass of a built-in layer: register it under
// a name of its own), an optimizer whose configuration cannot be saved (a custom one, a learning-rate schedule), or
// what save_checkpoint refuses (NaN or Inf in the state).
void save_model(Model& model, const std::string& path);

// The model save_model wrote, built, compiled as it was (when it was) and holding its state: predictions are
// bit-identical and fit() goes on as the saved model's would. Error naming the file and the problem: a damaged file
// (checksums, as load_checkpoint), a checkpoint without an architecture, an unknown layer class (with how to register
// it), an invalid configuration.
std::unique_ptr<Model> load_model(const std::string& path);

}  // namespace mixtrain
