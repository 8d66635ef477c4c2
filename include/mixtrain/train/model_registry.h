// Models built by name, as the CLI's --model flag names them. Each entry builds an uncompiled model for
// a data set's input and class count under the global policy in force (the caller sets it). The
// built-in ones: "mlp", "cnn", "resnet"; register_model() adds more (one file per model family).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/train/model.h"

namespace mixtrain {

struct RunConfig;

// What a model needs to know of its data.
struct ModelInputSpec {
  int64_t num_features = 0;           // elements per sample, as the data set stores it (flat rows)
  std::vector<int64_t> sample_shape;  // one sample's shape, e.g. {28, 28} for images; may be empty
  int64_t num_classes = 0;
};

using ModelBuilder = std::function<std::unique_ptr<Model>(const RunConfig& cfg, const ModelInputSpec& input)>;

// Adds (or replaces) a model kind. description: one line for usage texts.
void register_model(const std::string& name, const std::string& description, ModelBuilder builder);
// Registered names, sorted.
std::vector<std::string> model_names();
const std::string& model_description(const std::string& name);
// Builds cfg.model; Error listing the registered names when unknown.
std::unique_ptr<Model> make_registered_model(const RunConfig& cfg, const ModelInputSpec& input);

// The image shape (H, W, C) a convolutional model reads: sample_shape {H, W} or {H, W, C}, or a square
// single-channel image when num_features is a perfect square and no shape is known; Error otherwise.
std::vector<int64_t> image_shape_of(const ModelInputSpec& input);

}  // namespace mixtrain
