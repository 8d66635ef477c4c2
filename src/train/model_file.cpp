#include "mixtrain/train/model_file.h"

#include <charconv>

#include "mixtrain/io/safetensors.h"
#include "mixtrain/train/checkpoint.h"
#include "mixtrain/train/model.h"
#include "model_config.h"

namespace mixtrain {

namespace {

constexpr const char* kFormatKey = "model_format";
constexpr const char* kArchitectureKey = "model_architecture";
constexpr const char* kCompileKey = "model_compile";

const std::string& metadata_entry(const SafetensorsFile& file, const std::string& key) {
  auto it = file.metadata.find(key);
  if (it == file.metadata.end())
    MIXTRAIN_FAIL(kInvalidInput, "no '" << key << "' metadata", "the file is damaged; use another copy");
  return it->second;
}

// The architecture, compile configuration and seed of a whole-model file, read and checked before anything is built.
struct SavedModel {
  Json architecture, compile;
  uint64_t seed = 0;
};

SavedModel read_saved_model(const SafetensorsFile& file) {
  auto format = file.metadata.find(kFormatKey);
  if (format == file.metadata.end()) {
    MIXTRAIN_FAIL(kInvalidInput, "no model architecture in the file (it has no '" << kFormatKey << "' metadata)",
                  "a checkpoint (save_checkpoint) or a weights file loads into a model built in code with "
                  "load_checkpoint / load_weights; save_model writes files load_model reads");
  }
  if (format->second != kModelFormat) {
    MIXTRAIN_FAIL(kInvalidInput, "model format '" << format->second << "' is not supported (expected '"
                                                  << kModelFormat << "')",
                  "the file was written by another version of mixtrain");
  }
  SavedModel saved;
  saved.architecture = Json::parse(metadata_entry(file, kArchitectureKey), kArchitectureKey);
  saved.compile = Json::parse(metadata_entry(file, kCompileKey), kCompileKey);
  const std::string& seed = metadata_entry(file, "seed");
  auto [end, ec] = std::from_chars(seed.data(), seed.data() + seed.size(), saved.seed);
  MIXTRAIN_CHECK(ec == std::errc() && end == seed.data() + seed.size() && !seed.empty(),
                 "'seed' metadata '" << seed << "' is not an unsigned integer");
  return saved;
}

}  // namespace

void save_model(Model& model, const std::string& path) {
  MIXTRAIN_CHECK(model.built(), "save_model('" << path << "'): the model is not built; train it or call build_for() "
                                                  "first");
  CheckpointInfo info;
  try {
    info.extra_metadata[kFormatKey] = kModelFormat;
    info.extra_metadata[kArchitectureKey] = detail::model_architecture(model).dump();
    info.extra_metadata[kCompileKey] = detail::compile_configuration(model).dump();
  } catch (const Error& e) {
    MIXTRAIN_FAIL(kInvalidInput, "save_model('" << path << "'): " << e.message() << "; nothing was written", e.hint());
  }
  save_checkpoint(path, model, info);
}

void Model::save(const std::string& path) { save_model(*this, path); }

std::unique_ptr<Model> load_model(const std::string& path) {
  const SafetensorsFile file = load_safetensors(path);  // its checksums checked, before anything is built
  std::unique_ptr<Model> model;
  try {
    const SavedModel saved = read_saved_model(file);
    model = detail::model_from_architecture(saved.architecture, saved.seed);
    detail::compile_from_configuration(*model, saved.compile);
  } catch (const Error& e) {
    MIXTRAIN_FAIL(kInvalidInput, "load_model('" << path << "'): " << e.message(), e.hint());
  }
  load_checkpoint(path, *model);  // weights, optimizer state and random streams, each checked against the model
  return model;
}

}  // namespace mixtrain
