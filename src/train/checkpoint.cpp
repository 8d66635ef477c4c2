#include "mixtrain/train/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <iostream>
#include <set>
#include <string_view>

#include "mixtrain/core/json.h"
#include "mixtrain/io/safetensors.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/transfer.h"
#include "mixtrain/train/exact_json.h"
#include "mixtrain/train/model.h"
#include "mixtrain/train/recovery.h"
#include "fit_state_json.h"

namespace mixtrain {

namespace {

constexpr std::string_view kOptimizerPrefix = "optimizer/";
constexpr std::string_view kRngPrefix = "rng/";
// A callback's tensors (EarlyStopping's best weights): callback/<state key>/<tensor name>.
constexpr std::string_view kCallbackPrefix = "callback/";
// A layer's state besides its variables (Layer::extra_state: FP8 amax histories): layer_state/<layer name>/<entry>.
constexpr std::string_view kLayerStatePrefix = "layer_state/";
constexpr const char* kRebuildHint =
    "build and compile the model exactly as the run that saved the checkpoint (same layers in the same order, "
    "same policy, same optimizer)";

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

struct RngSlot {
  const char* key;
  Rng& (*get)(Model&);
};
// Order is part of the format only through the names; kept stable for readable files.
const RngSlot kRngSlots[] = {
    {"rng/init", [](Model& m) -> Rng& { return m.init_rng(); }},
    {"rng/shuffle", [](Model& m) -> Rng& { return m.shuffle_rng(); }},
    {"rng/dropout", [](Model& m) -> Rng& { return m.dropout_rng(); }},
};

// U8 (4, 8): word i in row i, least significant byte first (safetensors has no U64 in our dtype table).
Tensor encode_rng(const Rng& rng) {
  const std::vector<uint64_t> words = rng.state();
  Tensor t = Tensor::empty(Shape{4, 8}, DType::kUInt8);
  uint8_t* p = t.data<uint8_t>();
  for (size_t w = 0; w < 4; ++w)
    for (int b = 0; b < 8; ++b) p[w * 8 + b] = static_cast<uint8_t>(words[w] >> (8 * b));
  return t;
}

std::vector<uint64_t> decode_rng(const Tensor& t) {
  const uint8_t* p = t.data<uint8_t>();
  std::vector<uint64_t> words(4, 0);
  for (size_t w = 0; w < 4; ++w)
    for (int b = 0; b < 8; ++b) words[w] |= static_cast<uint64_t>(p[w * 8 + b]) << (8 * b);
  return words;
}

bool tensor_is_finite(const Tensor& t) { return ops::count_nonfinite(t) == 0; }

// The layer of `model` whose state entry `key` ("layer_state/<layer name>/<entry>") is, and the entry's name; the
// longest matching name wins, as a layer's name may hold "/" ("block_1/dense"). Null when no layer matches.
std::pair<Layer*, std::string> layer_state_owner(const Model& model, const std::string& key) {
  const std::string rest = key.substr(kLayerStatePrefix.size());
  Layer* owner = nullptr;
  size_t matched = 0;
  for (const auto& l : model.layers()) {
    const std::string& name = l->name();
    if (name.size() + 1 < rest.size() && name.size() > matched && starts_with(rest, name) && rest[name.size()] == '/') {
      owner = l.get();
      matched = name.size();
    }
  }
  return {owner, owner ? rest.substr(matched + 1) : std::string()};
}

// {"adam", false} or {"adam", true} for a LossScaleOptimizer around Adam.
std::pair<std::string, bool> optimizer_identity(const Optimizer& opt) {
  return {opt.checkpoint_name(), opt.scales_loss()};
}

std::string layer_list(const Model& model) {
  std::string out;
  for (const auto& l : model.layers()) out += (out.empty() ? "" : ",") + l->name();
  return out;
}

// A JSON array of the per-sample dimensions, e.g. "[28,28,1]".
std::string shape_json(const Shape& s) {
  std::string out = "[";
  for (int i = 0; i < s.rank(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

template <typename Int>
bool parse_int(const std::string& text, Int* out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && ptr == end && !text.empty();
}

// Building allocates the model's weights before they can be compared with the file's, so the saved input_shape
// decides how much the build asks for. A model's weights grow with its input (a Dense kernel holds a row per
// input feature), so a shape with more elements per sample than all the file's tensors together is damage;
// models whose weights do not grow with the input (global pooling) are still accepted up to this many elements.
constexpr int64_t kUncheckedInputElements = int64_t{1} << 20;

// The per-sample shape in the "input_shape" metadata: a JSON array of 1 to kMaxRank - 1 positive integers (the
// batch dimension comes on top), with at most max(kUncheckedInputElements, elements in the file) elements.
Shape saved_input_shape(const std::string& path, const std::string& text, const SafetensorsFile& file) {
  const auto fail = [&](const std::string& why) {
    MIXTRAIN_FAIL(kInvalidInput, "checkpoint '" << path << "': 'input_shape' metadata '" << text << "' " << why,
                  "the file is damaged; use another copy or an earlier checkpoint");
  };
  Json parsed;
  try {
    parsed = Json::parse(text, "input_shape");
  } catch (const Error& e) {
    fail("is not JSON: " + e.message());
  }
  if (!parsed.is_array() || parsed.size() < 1 || parsed.size() >= static_cast<size_t>(kMaxRank))
    fail("is not an array of 1 to " + std::to_string(kMaxRank - 1) + " dimensions");
  int64_t file_elements = 0;
  for (const auto& [name, t] : file.tensors) file_elements += t.numel();  // each fits the file, so no overflow
  const int64_t limit = std::max(kUncheckedInputElements, file_elements);
  std::vector<int64_t> dims;
  int64_t elements = 1;
  for (const Json& d : parsed.as_array()) {
    const double v = d.is_number() ? d.as_number() : 0;
    if (!(v >= 1 && v == std::floor(v))) fail("holds " + d.dump() + " where a positive integer dimension belongs");
    // v <= limit before the cast, and the product checked as it grows: a hostile value cannot overflow either.
    if (v > static_cast<double>(limit) || __builtin_mul_overflow(elements, static_cast<int64_t>(v), &elements) ||
        elements > limit)
      fail("asks for more than " + std::to_string(limit) + " elements per sample (the larger of " +
           std::to_string(kUncheckedInputElements) + " and the " + std::to_string(file_elements) +
           " values of the file's tensors)");
    dims.push_back(static_cast<int64_t>(v));
  }
  return Shape(std::move(dims));
}

}  // namespace

bool is_checkpoint_format(const std::string& format) {
  return format == kCheckpointFormat || format == kCheckpointFormatMidEpoch;
}

bool checkpoint_state_is_finite(const Model& model) {
  for (const Var& w : model.weights())
    if (!tensor_is_finite(w.value())) return false;
  if (model.compiled())
    for (const auto& [key, t] : model.optimizer().state())
      if (!tensor_is_finite(t)) return false;
  for (const auto& l : model.layers())
    for (const auto& [key, t] : l->extra_state())
      if (!tensor_is_finite(t)) return false;
  return true;
}

void save_checkpoint(const std::string& path, Model& model, const CheckpointInfo& info) {
  MIXTRAIN_CHECK(model.built(), "save_checkpoint('" << path << "'): the model is not built; train it or call "
                                                    << "build_for() first");
  MIXTRAIN_CHECK(info.epoch >= 0, "save_checkpoint('" << path << "'): epoch must be >= 0, got " << info.epoch);
  if (!checkpoint_state_is_finite(model)) {
    MIXTRAIN_FAIL(kInvalidInput,
                  "save_checkpoint('" << path << "'): the model's weights or optimizer state contain NaN or Inf; "
                                      << "nothing was written",
                  "training diverged: resume from an earlier checkpoint with a lower learning rate, or use loss "
                  "scaling under float16");
  }
  NamedTensors tensors;
  for (const Var& w : model.weights()) {
    const std::string& name = w.name();
    if (name.empty() || starts_with(name, kOptimizerPrefix) || starts_with(name, kRngPrefix) ||
        starts_with(name, kCallbackPrefix) || starts_with(name, kLayerStatePrefix)) {
      MIXTRAIN_FAIL(kInvalidInput,
                    "save_checkpoint('" << path << "'): weight name '" << name << "' is empty or uses a reserved "
                                        << "prefix (optimizer/, rng/, callback/, layer_state/)",
                    "give every layer a name that does not start with 'optimizer', 'rng', 'callback' or "
                    "'layer_state'");
    }
    tensors.emplace_back(name, w.value());
  }
  for (const auto& l : model.layers())
    for (const auto& [key, t] : l->extra_state())
      tensors.emplace_back(std::string(kLayerStatePrefix) + l->name() + "/" + key, t);
  std::map<std::string, std::string> meta;
  // Inside fit(): the loop's position and History, so a resume continues at the next batch.
  const std::optional<FitState> fit = model.fit_state();
  meta["format"] = fit && fit->step > 0 ? kCheckpointFormatMidEpoch : kCheckpointFormat;
  meta["epoch"] = std::to_string(fit ? fit->epoch : info.epoch);
  if (fit) {
    meta["step"] = std::to_string(fit->step);
    meta["fit_state"] = detail::fit_state_json(*fit);
    for (const auto& [key, state] : fit->callbacks)
      for (const auto& [name, t] : state.tensors) tensors.emplace_back(std::string(kCallbackPrefix) + key + "/" + name, t);
  }
  meta["seed"] = std::to_string(model.seed());
  meta["config"] = info.config;
  meta["layers"] = layer_list(model);
  meta["input_shape"] = shape_json(model.input_shape());
  for (const auto& l : model.layers()) meta["layer/" + l->name() + "/policy"] = l->dtype_policy().name();
  if (model.compiled()) {
    const auto [name, wrapped] = optimizer_identity(model.optimizer());
    meta["optimizer"] = name;
    meta["loss_scale_optimizer"] = wrapped ? "true" : "false";
    for (auto& [key, t] : model.optimizer().state()) tensors.emplace_back(std::string(kOptimizerPrefix) + key, t);
  } else {
    meta["optimizer"] = "";
    meta["loss_scale_optimizer"] = "false";
  }
  for (const auto& [key, value] : info.extra_metadata) {
    MIXTRAIN_CHECK(!meta.count(key) && !starts_with(key, "layer/") && !starts_with(key, "checksum/"),
                   "save_checkpoint('" << path << "'): extra metadata key '" << key
                                       << "' is one the checkpoint writes itself");
    meta[key] = value;
  }
  for (const RngSlot& r : kRngSlots) tensors.emplace_back(r.key, encode_rng(r.get(model)));
  // A model on a device: its tensors come back to the host to be written.
  for (auto& entry : tensors)
    if (!entry.second.device().is_cpu()) entry.second = ops::to_device(entry.second, Device::cpu());
  save_safetensors(path, tensors, meta);
}

namespace {

#define CKPT_FAIL(stream_expr, hint) MIXTRAIN_FAIL(kInvalidInput, "checkpoint '" << path_ << "': " << stream_expr, hint)
constexpr const char* kDamagedHint = "the file is damaged; use another copy or an earlier checkpoint";

// load_checkpoint's steps, in order: everything in the file is checked against the model before anything in the
// model changes (apply()).
class CheckpointLoad {
 public:
  CheckpointLoad(const std::string& path, Model& model) : path_(path), model_(model), file_(load_safetensors(path)) {}

  CheckpointInfo run() {
    // 1. Everything known before the model is built: format, layers, policies, optimizer, counters, Rng entries.
    check_format_and_layers();
    read_counters();
    read_fit_state();
    read_recovery_changes();
    check_policies();
    check_position_and_values();
    check_optimizer();
    read_rngs();
    // 2. Weights: an unbuilt model is built for the saved input shape first (validation needs its variables);
    // then the layers' states besides them.
    read_weights();
    read_layer_states();
    // 3. Optimizer slots must belong to the model's trainable variables, with their shapes.
    if (restore_optimizer_) check_optimizer_slots();
    // 4. Apply.
    apply();
    if (!info_.checksums_verified) {
      // Loaded rather than refused: files saved before checksums were added are otherwise valid and are often the
      // only copy of a long run; every structural and finiteness check above still applied.
      std::cerr << "warning: checkpoint '" << path_ << "' has no checksums (saved by an older mixtrain), so a damaged "
                << "byte in it cannot be detected; save it again to add them\n";
    }
    return info_;
  }

 private:
  const std::string* meta(const std::string& key) const {
    auto it = file_.metadata.find(key);
    return it == file_.metadata.end() ? nullptr : &it->second;
  }

  void check_format_and_layers() {
    format_ = meta("format");
    if (!format_)
      CKPT_FAIL("not a mixtrain checkpoint (no 'format' metadata)", "pass a file written by save_checkpoint");
    if (!is_checkpoint_format(*format_)) {
      CKPT_FAIL("format '" << *format_ << "' is not supported (expected '" << kCheckpointFormat << "' or '"
                           << kCheckpointFormatMidEpoch << "')",
                "the file was written by another version of mixtrain");
    }
    const std::string* layers = meta("layers");
    if (!layers || *layers != layer_list(model_)) {
      CKPT_FAIL("saved layers [" << (layers ? *layers : "") << "] differ from the model's [" << layer_list(model_)
                                 << "]",
                kRebuildHint);
    }
  }

  // The epoch, seed, run configuration and the optimizer's identity.
  void read_counters() {
    const std::string* epoch = meta("epoch");
    const std::string* seed = meta("seed");
    if (!epoch || !parse_int(*epoch, &info_.epoch) || info_.epoch < 0)
      CKPT_FAIL("'epoch' metadata '" << (epoch ? *epoch : "") << "' is not a non-negative integer", "");
    if (!seed || !parse_int(*seed, &info_.seed))
      CKPT_FAIL("'seed' metadata '" << (seed ? *seed : "") << "' is not an unsigned integer", "");
    if (const std::string* config = meta("config")) info_.config = *config;
    if (const std::string* opt = meta("optimizer")) info_.optimizer = *opt;
    const std::string* wrapped = meta("loss_scale_optimizer");
    if (wrapped && *wrapped != "true" && *wrapped != "false")
      CKPT_FAIL("'loss_scale_optimizer' metadata must be true or false, got '" << *wrapped << "'", "");
    info_.loss_scale_optimizer = wrapped && *wrapped == "true";
  }

  // The fit's position: "step" and "fit_state" together, agreeing with "epoch" and the format.
  void read_fit_state() {
    const std::string* step = meta("step");
    const std::string* fit_state = meta("fit_state");
    if (!step != !fit_state)
      CKPT_FAIL("has '" << (step ? "step" : "fit_state") << "' metadata without '" << (step ? "fit_state" : "step")
                        << "'",
                kDamagedHint);
    if (!fit_state) return;
    const auto fail = [&](const std::string& why) { CKPT_FAIL("'fit_state' metadata " << why, kDamagedHint); };
    FitState s = detail::parse_fit_state(*fit_state, fail);
    int64_t step_value = -1;
    if (!parse_int(*step, &step_value) || step_value != s.step)
      CKPT_FAIL("'step' metadata '" << *step << "' differs from the fit state's step " << s.step, "");
    if (s.epoch != info_.epoch)
      CKPT_FAIL("'epoch' metadata " << info_.epoch << " differs from the fit state's epoch " << s.epoch, "");
    info_.fit_state = std::move(s);
  }

  // What the recovery ladder changed in the model: its layers in float32 and its loss scaling are the saved
  // model's, so they are applied (apply()) instead of refused as a different model.
  void read_recovery_changes() {
    if (!info_.fit_state || info_.fit_state->recovery.empty()) return;
    try {
      RecoveryGuard().restore_state(info_.fit_state->recovery);  // the whole state checked here, not at fit()
      recovered_ = recovery_model_changes(info_.fit_state->recovery);
    } catch (const Error& e) {
      CKPT_FAIL("'fit_state' metadata: " << e.message(), kDamagedHint);
    }
  }

  void check_policies() {
    auto listed = [](const std::vector<std::string>& names, const std::string& name) {
      return std::find(names.begin(), names.end(), name) != names.end();
    };
    for (const auto& l : model_.layers()) {
      const std::string* policy = meta("layer/" + l->name() + "/policy");
      // A layer the ladder moved: to float32, or (the FP8 rung) from a float8 policy to mixed_bfloat16.
      const bool moved = policy && *policy != l->dtype_policy().name() &&
                         ((*policy == "float32" && listed(recovered_.float32_layers, l->name())) ||
                          (*policy == "mixed_bfloat16" && l->dtype_policy().uses_float8() &&
                           listed(recovered_.bfloat16_layers, l->name())));
      if (moved) {
        moved_.emplace_back(l.get(), *policy);
        continue;
      }
      if (!policy || *policy != l->dtype_policy().name()) {
        CKPT_FAIL("layer '" << l->name() << "' was saved under policy '" << (policy ? *policy : "?")
                            << "' but the model's is '" << l->dtype_policy().name() << "'",
                  kRebuildHint);
      }
    }
  }

  // The format names the position, and every tensor is finite.
  void check_position_and_values() {
    const bool mid_epoch = info_.fit_state && info_.fit_state->step > 0;
    if (mid_epoch != (*format_ == kCheckpointFormatMidEpoch))
      CKPT_FAIL("format '" << *format_ << "' does not match its position ("
                           << (mid_epoch ? "inside an epoch" : "an epoch boundary") << ")",
                kDamagedHint);
    info_.metadata = file_.metadata;
    info_.checksums_verified = file_.checksums_verified;
    // save_checkpoint never writes NaN or Inf, so one in the file is damage a checksum could not catch (a file of
    // an older version, or edited with its checksum recomputed): refuse it rather than resume from it.
    for (const auto& [key, t] : file_.tensors) {
      if (!tensor_is_finite(t))
        CKPT_FAIL("'" << key << "' holds NaN or Inf, which save_checkpoint never writes", "use an earlier checkpoint");
    }
  }

  void check_optimizer() {
    for (const auto& [key, t] : file_.tensors)
      if (starts_with(key, kOptimizerPrefix)) opt_state_.emplace_back(key.substr(kOptimizerPrefix.size()), t);
    restore_optimizer_ = model_.compiled() && !info_.optimizer.empty();
    if (!restore_optimizer_) return;
    const auto [name, is_wrapped] = optimizer_identity(model_.optimizer());
    // The recovery ladder switched loss scaling on in the run that saved the file.
    enable_loss_scaling_ = !is_wrapped && info_.loss_scale_optimizer && recovered_.enabled_loss_scaling;
    if (name != info_.optimizer || (is_wrapped || enable_loss_scaling_) != info_.loss_scale_optimizer) {
      auto describe = [](const std::string& n, bool w) { return w ? "loss_scale_optimizer(" + n + ")" : n; };
      CKPT_FAIL("saved optimizer " << describe(info_.optimizer, info_.loss_scale_optimizer)
                                   << " differs from the model's " << describe(name, is_wrapped),
                kRebuildHint);
    }
    if (opt_state_.empty())
      CKPT_FAIL("metadata names optimizer '" << info_.optimizer << "' but no optimizer/ entries", "");
  }

  void read_rngs() {
    for (const RngSlot& r : kRngSlots) {
      if (!file_.contains(r.key)) CKPT_FAIL("no '" << r.key << "' entry", "pass a file written by save_checkpoint");
      const Tensor& t = file_.get(r.key);
      if (t.dtype() != DType::kUInt8 || t.shape() != Shape{4, 8})
        CKPT_FAIL("'" << r.key << "' is " << t.describe() << ", expected uint8 (4, 8)", "");
      rng_states_.push_back(decode_rng(t));
      bool all_zero = true;
      for (uint64_t w : rng_states_.back()) all_zero = all_zero && w == 0;
      // xoshiro256** never leaves the all-zero state: such an entry is corrupt.
      if (all_zero) CKPT_FAIL("'" << r.key << "' is the all-zero state, which no generator reaches", "");
    }
  }

  void read_weights() {
    if (!model_.built()) {
      const std::string* input_shape = meta("input_shape");
      if (!input_shape) CKPT_FAIL("the model is not built and no 'input_shape' metadata says how to build it", "");
      model_.build_for(saved_input_shape(path_, *input_shape, file_));
    }
    weights_ = model_.weights();
    std::map<std::string, const Tensor*> by_name;
    for (const auto& [key, t] : file_.tensors) by_name[key] = &t;
    std::set<std::string> used;
    for (const Var& w : weights_) {
      auto it = by_name.find(w.name());
      if (it == by_name.end()) CKPT_FAIL("no weight '" << w.name() << "' (the model has it)", kRebuildHint);
      const Tensor& t = *it->second;
      if (t.dtype() != w.dtype() || t.shape() != w.shape()) {
        CKPT_FAIL("weight '" << w.name() << "' is " << t.describe() << " but the model's is " << w.value().describe(),
                  kRebuildHint);
      }
      values_.push_back(t.clone());
      used.insert(w.name());
    }
    for (const auto& [key, t] : file_.tensors) {
      if (starts_with(key, kOptimizerPrefix) || starts_with(key, kRngPrefix) || starts_with(key, kLayerStatePrefix) ||
          used.count(key))
        continue;
      if (!starts_with(key, kCallbackPrefix))
        CKPT_FAIL("weight '" << key << "' " << t.describe() << " has no variable in the model", kRebuildHint);
      add_callback_tensor(key, t);
    }
  }

  // layer_state/<layer name>/<entry>: each layer checks its own (after the recovery ladder's float32 layers are
  // float32 again: theirs was saved under float32). A file without them (an older one) leaves the layers as they are.
  void read_layer_states() {
    for (const auto& [key, t] : file_.tensors) {
      if (!starts_with(key, kLayerStatePrefix)) continue;
      auto [layer, entry] = layer_state_owner(model_, key);
      if (!layer) CKPT_FAIL("'" << key << "' belongs to no layer of the model", kRebuildHint);
      layer_states_[layer].emplace_back(entry, t.clone());
    }
    for (const auto& [layer, state] : layer_states_) {
      for (const auto& [moved, policy] : moved_)
        if (moved == layer)
          CKPT_FAIL("layer '" << layer->name() << "' was saved under " << policy << " but has state '"
                              << state.front().first << "'",
                    kDamagedHint);
      try {
        layer->check_extra_state(state);
      } catch (const Error& e) {
        CKPT_FAIL(e.message(), kRebuildHint);
      }
    }
  }

  // callback/<state key>/<name>, for a callback state the fit state holds.
  void add_callback_tensor(const std::string& key, const Tensor& t) {
    const std::string rest = key.substr(kCallbackPrefix.size());
    const size_t slash = rest.find('/');
    CallbackState* state = nullptr;
    if (info_.fit_state && slash != std::string::npos && slash + 1 < rest.size())
      for (auto& [state_key, st] : info_.fit_state->callbacks)
        if (state_key == rest.substr(0, slash)) state = &st;
    if (!state) CKPT_FAIL("'" << key << "' belongs to no callback state of the fit state", kDamagedHint);
    state->tensors.emplace_back(rest.substr(slash + 1), t);
  }

  bool opt_state_has(const std::string& key) const {
    for (const auto& entry : opt_state_)
      if (entry.first == key) return true;
    return false;
  }

  void check_optimizer_slots() {
    std::map<std::string, Shape> trainable;
    for (const Var& w : model_.trainable_weights()) trainable[w.name()] = w.shape();
    for (const auto& [key, t] : opt_state_) {
      if (key == "iterations" || key == "learning_rate" || starts_with(key, "loss_scale/")) continue;
      const auto slash = key.rfind('/');
      const std::string var = slash == std::string::npos ? key : key.substr(0, slash);
      auto it = trainable.find(var);
      if (it == trainable.end())
        CKPT_FAIL("optimizer entry '" << key << "' belongs to no trainable variable of the model", kRebuildHint);
      if (t.shape() != it->second) {
        CKPT_FAIL("optimizer entry '" << key << "' is " << t.describe() << " but variable '" << var << "' is "
                                      << it->second,
                  kRebuildHint);
      }
      const Optimizer& rule = model_.optimizer().inner_optimizer();
      const std::string slot = slash == std::string::npos ? key : key.substr(slash + 1);
      if (slot == "kahan" && !rule.keeps_slot("kahan"))
        CKPT_FAIL("optimizer state holds Kahan compensation ('" << key << "') but the optimizer keeps none",
                  "resume with --master-rounding kahan, the rounding it was saved with");
      if (slot == "m" && rule.keeps_slot("kahan") && !opt_state_has(var + "/kahan"))
        CKPT_FAIL("optimizer state has no Kahan compensation ('" << var << "/kahan') but the optimizer keeps one",
                  "resume with the --master-rounding it was saved with (nearest or stochastic)");
      // Refused rather than converted: rounding float32 moments to bfloat16 (or widening bfloat16 ones) would
      // continue another run than the one saved, and a resume promises the same bits.
      const DType state = rule.slot_dtype(slot);
      if (t.dtype() != state && slot == "kahan")
        CKPT_FAIL("'" << key << "' is " << t.describe() << ", not bfloat16", kDamagedHint);
      if (t.dtype() != state) {
        CKPT_FAIL("optimizer state is " << dtype_name(t.dtype()) << " ('" << key << "') but the optimizer keeps "
                                        << dtype_name(state) << " state",
                  std::string("resume with --optimizer-state ") +
                      dtype_name(t.dtype()) + ", the state it was saved with");
      }
    }
  }

  // load_state is the only step that can still throw, and it leaves the optimizer unchanged when it does.
  void apply() {
    for (const auto& [l, policy] : moved_) l->set_dtype_policy(DTypePolicy::from_name(policy));
    if (enable_loss_scaling_) model_.enable_dynamic_loss_scaling();
    if (restore_optimizer_) {
      try {
        model_.optimizer().load_state(opt_state_);
      } catch (const Error& e) {
        CKPT_FAIL(e.message(), e.hint());
      }
    }
    for (const auto& [layer, state] : layer_states_) layer->load_extra_state(state);
    for (size_t i = 0; i < weights_.size(); ++i) {
      Var w = weights_[i];
      w.set_value(values_[i]);  // bumps the version, so cached compute-dtype casts refresh
    }
    for (size_t i = 0; i < std::size(kRngSlots); ++i) kRngSlots[i].get(model_).set_state(rng_states_[i]);
  }

  const std::string& path_;
  Model& model_;
  const SafetensorsFile file_;
  const std::string* format_ = nullptr;
  CheckpointInfo info_;
  RecoveryModelChanges recovered_;
  std::vector<std::pair<Layer*, std::string>> moved_;  // layers the recovery ladder moved, and their policies
  NamedTensors opt_state_;
  bool restore_optimizer_ = false;
  bool enable_loss_scaling_ = false;
  std::vector<std::vector<uint64_t>> rng_states_;
  std::vector<Var> weights_;
  std::vector<Tensor> values_;
  std::map<Layer*, Layer::LayerState> layer_states_;
};

#undef CKPT_FAIL

}  // namespace

CheckpointInfo load_checkpoint(const std::string& path, Model& model) { return CheckpointLoad(path, model).run(); }

CheckpointCallback::CheckpointCallback(std::string path, int period, std::string config, int64_t every_steps)
    : path_(std::move(path)), period_(period), config_(std::move(config)), every_steps_(every_steps) {
  MIXTRAIN_CHECK(!path_.empty(), "CheckpointCallback: path is empty");
  MIXTRAIN_CHECK(period_ > 0, "CheckpointCallback: period must be positive, got " << period_);
  MIXTRAIN_CHECK(every_steps_ >= 0, "CheckpointCallback: every_steps must be >= 0 (0: epoch ends only), got "
                                        << every_steps_);
}

CheckpointCallback::CheckpointCallback(std::string path, const CheckpointOptions& options)
    : CheckpointCallback(std::move(path), options.period, options.config, options.every_steps) {
  set_monitor({.monitor = options.monitor, .save_best_only = options.save_best_only, .mode = options.mode});
}

std::string CheckpointCallback::path_for(int completed_epochs) const {
  std::string out = path_;
  const std::string token = "{epoch}", value = std::to_string(completed_epochs);
  for (size_t pos = out.find(token); pos != std::string::npos; pos = out.find(token, pos + value.size()))
    out.replace(pos, token.size(), value);
  return out;
}

void CheckpointCallback::set_monitor(CheckpointMonitor monitor) {
  MIXTRAIN_CHECK(monitor.mode == "auto" || monitor.mode == "min" || monitor.mode == "max",
                 "CheckpointCallback: unknown mode '" << monitor.mode << "'; valid modes: auto, min, max");
  MIXTRAIN_CHECK(!monitor.monitor.empty(), "CheckpointCallback: monitor is empty");
  // Keras' "auto": accuracy-like quantities improve upward, everything else downward.
  maximize_ = monitor.mode == "max" || (monitor.mode == "auto" && monitor.monitor.find("acc") != std::string::npos);
  monitor_ = std::move(monitor);
  best_ = maximize_ ? -INFINITY : INFINITY;
}

void CheckpointCallback::on_train_begin(int epochs, int64_t steps_per_epoch) {
  (void)epochs;
  steps_per_epoch_ = steps_per_epoch;
  best_ = maximize_ ? -INFINITY : INFINITY;
  saved_step_ = -1;
}

bool CheckpointCallback::improves(const Logs& logs) {
  if (!has_log(logs, monitor_.monitor)) {
    std::string available;
    for (const auto& [k, v] : logs) available += (available.empty() ? "" : ", ") + k;
    MIXTRAIN_FAIL(kInvalidInput,
                  "CheckpointCallback: the monitored metric '" << monitor_.monitor
                                                               << "' is not logged; available metrics: " << available,
                  "monitor one of those (val_* needs validation data)");
  }
  const double current = log_value(logs, monitor_.monitor);
  if (!(maximize_ ? current > best_ : current < best_)) return false;  // NaN compares false: never the best
  best_ = current;
  return true;
}

void CheckpointCallback::on_epoch_begin(int epoch) { epoch_ = epoch; }

void CheckpointCallback::on_train_batch_end(int64_t step, const Logs& logs) {
  (void)logs;
  if (every_steps_ == 0) return;
  // The step of the whole data stream, the same in a resumed run as in an uninterrupted one.
  const int64_t global_step = static_cast<int64_t>(epoch_) * steps_per_epoch_ + step;
  if (global_step % every_steps_ != 0) return;
  if (save(path_for(epoch_ + 1), epoch_, "step " + std::to_string(global_step))) saved_step_ = global_step;
}

void CheckpointCallback::on_train_interrupted(int epoch, int64_t steps_done) {
  // The position a resumed fit continues from; already written when a step save fell on this step.
  const int64_t global_step = static_cast<int64_t>(epoch) * steps_per_epoch_ + steps_done;
  if (global_step == saved_step_) return;
  if (save(path_for(epoch + 1), epoch, "step " + std::to_string(global_step))) saved_step_ = global_step;
}

void CheckpointCallback::on_epoch_end(int epoch, const Logs& logs) {
  const int completed = epoch + 1;
  if (completed % period_ != 0) return;
  if (monitor_.save_best_only && !improves(logs)) return;
  save(path_for(completed), completed, "epoch " + std::to_string(completed));
}

bool CheckpointCallback::save(const std::string& path, int completed_epochs, const std::string& when) {
  MIXTRAIN_CHECK(model_ != nullptr, "CheckpointCallback: no model (fit() sets it)");
  // ZeRO-1: the whole state on every rank (a collective), then the file is rank 0's.
  if (model_->compiled()) model_->optimizer().inner_optimizer().gather_shards();
  if (!writes_) return false;
  if (!checkpoint_state_is_finite(*model_)) {
    ++skipped_saves_;
    std::cerr << "warning: " << when << ": weights or optimizer state contain NaN or Inf; checkpoint '" << path
              << "' not written"
              << (last_saved_path_.empty() ? "" : " (the last good one is '" + last_saved_path_ + "')") << "\n";
    return false;
  }
  CheckpointInfo info;
  info.epoch = completed_epochs;
  info.config = config_;
  save_checkpoint(path, *model_, info);
  ++saves_;
  last_saved_path_ = path;
  return true;
}

}  // namespace mixtrain
