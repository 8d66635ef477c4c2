// A model's architecture and compile configuration as JSON, both ways: what save_model writes into a file's
// metadata and load_model builds from (train/model_file.h, where the format is described).
#pragma once

#include <cstdint>
#include <memory>

#include "mixtrain/core/json.h"
#include "mixtrain/train/model.h"

namespace mixtrain::detail {

// {"class_name": "Sequential" | "Functional", "name", "layers": [{"class_name", "registered_name", "config"}], and
// for a graph "nodes", "inputs", "outputs"}. Error naming a layer that cannot be saved.
Json model_architecture(const Model& model);
// A new model (not built for a stack; built for a graph, as its constructor does) with `seed`.
std::unique_ptr<Model> model_from_architecture(const Json& architecture, uint64_t seed);

// {"optimizer": optimizer_config() or null, "loss": {"name", "from_logits"}, "metrics": [...]}; null when the
// model is not compiled.
Json compile_configuration(const Model& model);
// Compiles model as compile_configuration() describes (nothing for null).
void compile_from_configuration(Model& model, const Json& compile);

}  // namespace mixtrain::detail
