#include "mixtrain/train/model_registry.h"

#include <cmath>
#include <map>
#include <mutex>

#include "mixtrain/train/run_config.h"

namespace mixtrain {

void register_builtin_models();  // model_zoo.cpp

namespace {
struct Entry {
  std::string description;
  ModelBuilder builder;
  ModelSizeEstimator estimate;
};

std::map<std::string, Entry>& registry() {
  static std::map<std::string, Entry> r;
  return r;
}

std::mutex& registry_mutex() {
  static std::mutex mu;
  return mu;
}

// The built-ins are registered on first use (no static initialisation order to depend on).
void ensure_builtins() {
  static std::once_flag once;
  std::call_once(once, [] { register_builtin_models(); });
}

std::string joined_names() {
  std::string out;
  for (const auto& [name, e] : registry()) out += (out.empty() ? "" : ", ") + name;
  return out;
}
// The entry of `name` (the registry's lock held); Error listing the valid names when unknown.
const Entry& find_entry(const std::string& name) {
  auto it = registry().find(name);
  MIXTRAIN_CHECK(it != registry().end(), "unknown model '" << name << "'; valid models: " << joined_names());
  return it->second;
}

// A copy of the entry of `name`, taken under the lock, so its builder runs without it.
Entry entry_of(const std::string& name) {
  ensure_builtins();
  std::lock_guard<std::mutex> lock(registry_mutex());
  return find_entry(name);
}
}  // namespace

void register_model(const std::string& name, const std::string& description, ModelBuilder builder,
                    ModelSizeEstimator estimate) {
  MIXTRAIN_CHECK(!name.empty() && builder, "register_model: a model needs a name and a builder");
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[name] = Entry{description, std::move(builder), std::move(estimate)};
}

std::vector<std::string> model_names() {
  ensure_builtins();
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<std::string> out;
  for (const auto& [name, e] : registry()) out.push_back(name);
  return out;
}

const std::string& model_description(const std::string& name) {
  ensure_builtins();
  std::lock_guard<std::mutex> lock(registry_mutex());
  return find_entry(name).description;
}

std::unique_ptr<Model> make_registered_model(const RunConfig& cfg, const ModelInputSpec& input) {
  return entry_of(cfg.model).builder(cfg, input);
}

std::optional<ModelSizeEstimate> estimate_model_size(const RunConfig& cfg, const ModelInputSpec& input) {
  const ModelSizeEstimator estimate = entry_of(cfg.model).estimate;
  if (!estimate) return std::nullopt;
  return estimate(cfg, input);
}

std::vector<int64_t> image_shape_of(const ModelInputSpec& input) {
  const auto& s = input.sample_shape;
  int64_t count = 1;
  for (int64_t d : s) count *= d;
  if ((s.size() == 2 || s.size() == 3) && count == input.num_features) {
    std::vector<int64_t> hwc = s;
    if (hwc.size() == 2) hwc.push_back(1);
    return hwc;
  }
  const auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(input.num_features))));
  MIXTRAIN_CHECK(side > 0 && side * side == input.num_features,
                 "a convolutional model needs images; the data has " << input.num_features << " features per sample"
                                                                     << (s.empty() ? "" : " of shape " + Shape(s).to_string())
                                                                     << ", which is not an image shape (use --model mlp)");
  return {side, side, 1};
}

}  // namespace mixtrain
