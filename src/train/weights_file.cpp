#include "mixtrain/train/weights_file.h"

#include <iostream>
#include <map>
#include <sstream>
#include <utility>

#include "mixtrain/core/json.h"
#include "mixtrain/io/safetensors.h"
#include "mixtrain/train/checkpoint.h"
#include "mixtrain/ops/transfer.h"
#include "mixtrain/train/model.h"

namespace mixtrain {

namespace {

constexpr const char* kLoadHint =
    "build the model as it was built when its weights were saved (same layers, units and order); "
    "load_weights(model, path, /*by_name=*/true) matches weights by path instead of by order, and "
    "skip_mismatch skips weights whose shapes differ";

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

std::string shape_json(const Shape& s) {
  std::string out = "[";
  for (int i = 0; i < s.rank(); ++i) {
    if (i) out += ',';
    out += std::to_string(s[i]);
  }
  return out + "]";
}

// The weight entries of a file in its order: for a checkpoint, everything but its optimizer, Rng and layer state.
std::vector<const std::pair<std::string, Tensor>*> weight_entries(const SafetensorsFile& file) {
  auto it = file.metadata.find("format");
  const bool checkpoint = it != file.metadata.end() && is_checkpoint_format(it->second);
  std::vector<const std::pair<std::string, Tensor>*> out;
  for (const auto& entry : file.tensors) {
    if (checkpoint && (starts_with(entry.first, "optimizer/") || starts_with(entry.first, "rng/") ||
                       starts_with(entry.first, "layer_state/")))
      continue;
    out.push_back(&entry);
  }
  return out;
}

}  // namespace

void save_weights(const Model& model, const std::string& path) {
  if (!model.built()) {
    MIXTRAIN_FAIL(kInvalidInput, "save_weights('" << path << "'): model '" << model.name()
                                                  << "' is not built, so it has no weights yet",
                  "train it, or call build_for(sample_shape) first");
  }
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const Var& w : model.weights()) {
    MIXTRAIN_CHECK(!w.name().empty(), "save_weights('" << path << "'): a weight of model '" << model.name()
                                                       << "' has no name; weights are saved by path");
    tensors.emplace_back(w.name(), ops::to_device(w.value(), Device::cpu()));  // from a device, if there
  }
  std::string layers;
  for (const auto& l : model.layers()) layers += (layers.empty() ? "" : ",") + l->name();
  save_safetensors(path, tensors,
                   {{"format", kWeightsFormat}, {"layers", layers}, {"input_shape", shape_json(model.input_shape())}});
}

LoadWeightsReport load_weights(Model& model, const std::string& path, bool by_name, bool skip_mismatch) {
  const SafetensorsFile file = load_safetensors(path);
  const std::vector<const std::pair<std::string, Tensor>*> entries = weight_entries(file);
  const std::string where = "load_weights('" + path + "')";
  if (!model.built()) {
    auto it = file.metadata.find("input_shape");
    if (it == file.metadata.end()) {
      MIXTRAIN_FAIL(kInvalidInput, where << ": model '" << model.name()
                                         << "' is not built and the file has no 'input_shape' to build it for",
                    "call build_for(sample_shape) before load_weights");
    }
    std::vector<int64_t> dims;
    const Json parsed = Json::parse(it->second, path + " input_shape");  // kept alive: as_array() refers into it
    for (const Json& d : parsed.as_array()) dims.push_back(d.as_int64());
    model.build_for(Shape(dims));
  }
  const std::vector<Var> weights = model.weights();
  if (!by_name && entries.size() != weights.size()) {
    MIXTRAIN_FAIL(kInvalidInput, where << ": the file holds " << entries.size() << " weights, model '"
                                       << model.name() << "' has " << weights.size()
                                       << " (weights are matched by order unless by_name)",
                  kLoadHint);
  }
  std::map<std::string, const Tensor*> by_path;
  for (const auto* e : entries) by_path[e->first] = &e->second;

  // Validate every pair first; assign only when the whole file fits.
  LoadWeightsReport report;
  std::vector<std::pair<Var, const Tensor*>> assign;
  for (size_t i = 0; i < weights.size(); ++i) {
    const Var& w = weights[i];
    const Tensor* t = nullptr;
    std::string source;
    if (by_name) {
      auto it = by_path.find(w.name());
      if (it == by_path.end()) {
        report.skipped.push_back(w.name() + ": not in the file");
        continue;
      }
      t = it->second;
      source = w.name();
    } else {
      t = &entries[i]->second;
      source = entries[i]->first;
    }
    const std::string pair_text =
        "weight '" + w.name() + "' " + w.value().describe() + " and the file's '" + source + "' " + t->describe();
    if (!is_float(t->dtype()) && t->dtype() != w.dtype()) {
      MIXTRAIN_FAIL(kInvalidInput, where << ": " << pair_text << " differ in dtype",
                    "a floating weight takes a floating value (converted); this entry is not a weight of this model");
    }
    if (t->shape() != w.shape()) {
      if (skip_mismatch) {
        std::cerr << "warning: " << where << ": skipping " << pair_text << ": shapes differ\n";
        report.skipped.push_back(w.name() + ": shape " + shape_json(w.shape()) + " differs from the file's " +
                                 shape_json(t->shape()));
        continue;
      }
      MIXTRAIN_FAIL(kInvalidInput, where << ": " << pair_text << " differ in shape", kLoadHint);
    }
    assign.emplace_back(w, t);
    report.loaded.push_back(w.name());
  }
  for (auto& [w, t] : assign) w.set_value(*t);  // converts the dtype, bumps the version (cached casts refresh)
  return report;
}

}  // namespace mixtrain
