// Models built by name, as the CLI's --model flag names them. Each entry builds an uncompiled model for
// a data set's input and class count under the global policy in force (the caller sets it). The
// built-in ones: "mlp", "cnn", "resnet"; register_model() adds more (one file per model family).
#pragma once

#include <functional>
#include <memory>
#include <optional>
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

// What a model kind knows of its size before it is built, as lower bounds (doubles: a user's sizes may multiply
// past int64): its weights, and the activations one sample keeps for the backward pass (elements). Enough to
// refuse a model that cannot fit in memory before any of its weights is allocated or initialized.
struct ModelSizeEstimate {
  double weights = 0;
  double activations_per_sample = 0;
  double largest_activation_per_sample = 0;  // the widest single output (its gradient exists at some point)
};
using ModelSizeEstimator = std::function<ModelSizeEstimate(const RunConfig& cfg, const ModelInputSpec& input)>;

// Adds (or replaces) a model kind. description: one line for usage texts. estimate (optional) says how large
// the model will be, without building it.
void register_model(const std::string& name, const std::string& description, ModelBuilder builder,
                    ModelSizeEstimator estimate = nullptr);
// The estimate of cfg.model, or nullopt when its kind gives none. Error when the name is unknown.
std::optional<ModelSizeEstimate> estimate_model_size(const RunConfig& cfg, const ModelInputSpec& input);
// Registered names, sorted.
std::vector<std::string> model_names();
const std::string& model_description(const std::string& name);
// Builds cfg.model; Error listing the registered names when unknown.
std::unique_ptr<Model> make_registered_model(const RunConfig& cfg, const ModelInputSpec& input);

// The image shape (H, W, C) a convolutional model reads: sample_shape {H, W} or {H, W, C}, or a square
// single-channel image when num_features is a perfect square and no shape is known; Error otherwise.
std::vector<int64_t> image_shape_of(const ModelInputSpec& input);

}  // namespace mixtrain
