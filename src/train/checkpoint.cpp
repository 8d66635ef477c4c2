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

namespace mixtrain {

namespace {

constexpr std::string_view kOptimizerPrefix = "optimizer/";
constexpr std::string_view kRngPrefix = "rng/";
// A callback's tensors (EarlyStopping's best weights): callback/<state key>/<tensor name>.
constexpr std::string_view kCallbackPrefix = "callback/";
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

// ---- The fit state as JSON (doubles through exact_number, so they read back bit for bit) ----
std::string hex_word(uint64_t w) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(w));
  return buf;
}

std::string fit_state_json(const FitState& s) {
  Json j = Json::object();
  j["epoch"] = s.epoch;
  j["step"] = s.step;
  j["steps_per_epoch"] = s.steps_per_epoch;
  j["batch_size"] = s.batch_size;
  j["rows"] = s.rows;
  j["shuffle"] = s.shuffle;
  j["sampled"] = s.sampled;
  Json words = Json::array();
  for (uint64_t w : s.epoch_shuffle_state) words.push_back(hex_word(w));  // 64 bits do not fit a double
  j["epoch_shuffle_state"] = words;
  Json sums = Json::array();
  for (const auto& [k, v] : s.sums) sums.push_back(Json::array({Json(k), exact_number(v)}));
  j["sums"] = sums;
  j["seen"] = s.seen;
  const History& h = s.history;
  Json hist = Json::object();
  Json epochs = Json::array();
  for (int e : h.epoch) epochs.push_back(e);
  hist["epoch"] = epochs;
  Json metrics = Json::object();
  for (const auto& [k, v] : h.history) metrics[k] = exact_numbers(v);
  hist["history"] = metrics;
  hist["step_loss"] = exact_numbers(h.step_loss);
  hist["epoch_seconds"] = exact_numbers(h.epoch_seconds);
  hist["step_loss_scale"] = exact_numbers(h.step_loss_scale);
  hist["steps"] = h.steps;
  hist["samples"] = h.samples;
  hist["train_seconds"] = exact_number(h.train_seconds);
  j["history"] = hist;
  // Nested as JSON rather than as strings, so the header stays readable; their tensors are saved apart.
  if (!s.recovery.empty()) j["recovery"] = Json::parse(s.recovery, "recovery state");
  Json callbacks = Json::object();
  for (const auto& [key, state] : s.callbacks) callbacks[key] = Json::parse(state.json, key + " state");
  j["callbacks"] = callbacks;
  return j.dump();
}

// The FitState of a "fit_state" metadata entry; fail(why) (which throws) on anything malformed.
FitState parse_fit_state(const std::string& text, const std::function<void(const std::string&)>& fail) {
  Json j;
  try {
    j = Json::parse(text, "fit_state");
  } catch (const Error& e) {
    fail("is not JSON: " + e.message());
  }
  const auto member = [&](const Json& obj, const char* key) -> const Json& {
    const Json* v = obj.is_object() ? obj.find(key) : nullptr;
    if (!v) fail(std::string("has no '") + key + "'");
    return *v;
  };
  const auto integer = [&](const Json& obj, const char* key, int64_t min) {
    const Json& v = member(obj, key);
    if (!v.is_number() || v.as_number() != std::floor(v.as_number()) || std::fabs(v.as_number()) > 9007199254740992.0 ||
        v.as_int64() < min)
      fail(std::string("'") + key + "' is " + v.dump() + ", expected an integer >= " + std::to_string(min));
    return v.as_int64();
  };
  const auto boolean = [&](const Json& obj, const char* key) {
    const Json& v = member(obj, key);
    if (!v.is_bool()) fail(std::string("'") + key + "' is " + v.dump() + ", expected true or false");
    return v.as_bool();
  };
  const auto number = [&](const Json& v, const std::string& where) -> double {
    const std::optional<double> d = read_exact_number(v);
    if (!d) fail(where + " holds " + v.dump() + ", expected a number");
    return *d;
  };
  const auto numbers = [&](const Json& obj, const char* key) {
    const Json& v = member(obj, key);
    if (!v.is_array()) fail(std::string("'") + key + "' is not an array");
    std::vector<double> out;
    for (const Json& e : v.as_array()) out.push_back(number(e, std::string("'") + key + "'"));
    return out;
  };
  FitState s;
  const int64_t epoch = integer(j, "epoch", 0);
  if (epoch > std::numeric_limits<int>::max()) fail("'epoch' " + std::to_string(epoch) + " is out of range");
  s.epoch = static_cast<int>(epoch);
  s.step = integer(j, "step", 0);
  s.steps_per_epoch = integer(j, "steps_per_epoch", 1);
  if (s.step > s.steps_per_epoch)
    fail("'step' " + std::to_string(s.step) + " is past the epoch's " + std::to_string(s.steps_per_epoch) + " steps");
  s.batch_size = integer(j, "batch_size", 1);
  s.rows = integer(j, "rows", 1);
  s.shuffle = boolean(j, "shuffle");
  s.sampled = boolean(j, "sampled");
  const Json& words = member(j, "epoch_shuffle_state");
  if (!words.is_array() || (words.size() != 0 && words.size() != 4))
    fail("'epoch_shuffle_state' is not an array of 0 or 4 words");
  for (const Json& w : words.as_array()) {
    uint64_t v = 0;
    if (!w.is_string() || w.as_string().size() != 16) fail("'epoch_shuffle_state' holds " + w.dump());
    const std::string& t = w.as_string();
    const auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), v, 16);
    if (ec != std::errc() || ptr != t.data() + t.size()) fail("'epoch_shuffle_state' holds " + w.dump());
    s.epoch_shuffle_state.push_back(v);
  }
  if (s.step > 0 && s.epoch_shuffle_state.size() != 4)
    fail("'epoch_shuffle_state' is missing for an epoch in progress (step " + std::to_string(s.step) + ")");
  const auto is_zero = [](uint64_t w) { return w == 0; };
  if (s.step > 0 && std::all_of(s.epoch_shuffle_state.begin(), s.epoch_shuffle_state.end(), is_zero))
    fail("'epoch_shuffle_state' is the all-zero state, which no generator reaches");
  const Json& sums = member(j, "sums");
  if (!sums.is_array()) fail("'sums' is not an array");
  for (const Json& e : sums.as_array()) {
    if (!e.is_array() || e.size() != 2 || !e.at(size_t{0}).is_string()) fail("'sums' holds " + e.dump());
    s.sums.emplace_back(e.at(size_t{0}).as_string(), number(e.at(size_t{1}), "'sums'"));
  }
  s.seen = integer(j, "seen", 0);
  const Json& h = member(j, "history");
  History& hist = s.history;
  const Json& epochs = member(h, "epoch");
  if (!epochs.is_array()) fail("'history.epoch' is not an array");
  for (const Json& e : epochs.as_array()) {
    if (!e.is_number() || e.as_number() != std::floor(e.as_number()) || e.as_number() < 0 ||
        e.as_number() > std::numeric_limits<int>::max())
      fail("'history.epoch' holds " + e.dump());
    hist.epoch.push_back(static_cast<int>(e.as_number()));
  }
  const Json& metrics = member(h, "history");
  if (!metrics.is_object()) fail("'history.history' is not an object");
  for (const auto& [key, v] : metrics.as_object()) hist.history[key] = numbers(metrics, key.c_str());
  hist.step_loss = numbers(h, "step_loss");
  hist.epoch_seconds = numbers(h, "epoch_seconds");
  hist.step_loss_scale = numbers(h, "step_loss_scale");
  hist.steps = integer(h, "steps", 0);
  hist.samples = integer(h, "samples", 0);
  hist.train_seconds = number(member(h, "train_seconds"), "'train_seconds'");
  // Both absent from files saved before callbacks and the recovery ladder kept state: they resume with none.
  if (const Json* r = j.find("recovery")) {
    if (!r->is_object()) fail("'recovery' is " + r->dump() + ", expected an object");
    s.recovery = r->dump();
  }
  if (const Json* cbs = j.find("callbacks")) {
    if (!cbs->is_object()) fail("'callbacks' is not an object");
    for (const auto& [key, state] : cbs->as_object()) {
      if (key.empty() || key.find('/') != std::string::npos || !state.is_object())
        fail("'callbacks' holds '" + key + "': " + state.dump());
      s.callbacks.emplace_back(key, CallbackState{state.dump(), {}});
    }
  }
  if (hist.epoch_seconds.size() != hist.epoch.size())
    fail("'history' records " + std::to_string(hist.epoch.size()) + " epochs but " +
         std::to_string(hist.epoch_seconds.size()) + " epoch times");
  for (const auto& [key, v] : hist.history)
    if (v.size() != hist.epoch.size())
      fail("'history." + key + "' holds " + std::to_string(v.size()) + " values for " +
           std::to_string(hist.epoch.size()) + " epochs");
  return s;
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
        starts_with(name, kCallbackPrefix)) {
      MIXTRAIN_FAIL(kInvalidInput,
                    "save_checkpoint('" << path << "'): weight name '" << name << "' is empty or uses a reserved "
                                        << "prefix (optimizer/, rng/, callback/)",
                    "give every layer a name that does not start with 'optimizer', 'rng' or 'callback'");
    }
    tensors.emplace_back(name, w.value());
  }
  std::map<std::string, std::string> meta;
  // Inside fit(): the loop's position and History, so a resume continues at the next batch.
  const std::optional<FitState> fit = model.fit_state();
  meta["format"] = fit && fit->step > 0 ? kCheckpointFormatMidEpoch : kCheckpointFormat;
  meta["epoch"] = std::to_string(fit ? fit->epoch : info.epoch);
  if (fit) {
    meta["step"] = std::to_string(fit->step);
    meta["fit_state"] = fit_state_json(*fit);
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
  for (const RngSlot& r : kRngSlots) tensors.emplace_back(r.key, encode_rng(r.get(model)));
  // A model on a device: its tensors come back to the host to be written.
  for (auto& entry : tensors)
    if (!entry.second.device().is_cpu()) entry.second = ops::to_device(entry.second, Device::cpu());
  save_safetensors(path, tensors, meta);
}

CheckpointInfo load_checkpoint(const std::string& path, Model& model) {
  const SafetensorsFile file = load_safetensors(path);
  auto meta = [&](const std::string& key) -> const std::string* {
    auto it = file.metadata.find(key);
    return it == file.metadata.end() ? nullptr : &it->second;
  };
#define CKPT_FAIL(stream_expr, hint) MIXTRAIN_FAIL(kInvalidInput, "checkpoint '" << path << "': " << stream_expr, hint)

  // 1. Everything known before the model is built: format, layers, policies, optimizer, counters, Rng entries.
  const std::string* format = meta("format");
  if (!format) CKPT_FAIL("not a mixtrain checkpoint (no 'format' metadata)", "pass a file written by save_checkpoint");
  if (!is_checkpoint_format(*format)) {
    CKPT_FAIL("format '" << *format << "' is not supported (expected '" << kCheckpointFormat << "' or '"
                         << kCheckpointFormatMidEpoch << "')",
              "the file was written by another version of mixtrain");
  }
  const std::string* layers = meta("layers");
  if (!layers || *layers != layer_list(model)) {
    CKPT_FAIL("saved layers [" << (layers ? *layers : "") << "] differ from the model's [" << layer_list(model) << "]",
              kRebuildHint);
  }
  CheckpointInfo info;
  const std::string* epoch = meta("epoch");
  const std::string* seed = meta("seed");
  if (!epoch || !parse_int(*epoch, &info.epoch) || info.epoch < 0)
    CKPT_FAIL("'epoch' metadata '" << (epoch ? *epoch : "") << "' is not a non-negative integer", "");
  if (!seed || !parse_int(*seed, &info.seed))
    CKPT_FAIL("'seed' metadata '" << (seed ? *seed : "") << "' is not an unsigned integer", "");
  if (const std::string* config = meta("config")) info.config = *config;
  if (const std::string* opt = meta("optimizer")) info.optimizer = *opt;
  const std::string* wrapped = meta("loss_scale_optimizer");
  if (wrapped && *wrapped != "true" && *wrapped != "false")
    CKPT_FAIL("'loss_scale_optimizer' metadata must be true or false, got '" << *wrapped << "'", "");
  info.loss_scale_optimizer = wrapped && *wrapped == "true";
  // The fit's position: "step" and "fit_state" together, agreeing with "epoch" and the format.
  const std::string* step = meta("step");
  const std::string* fit_state = meta("fit_state");
  if (!step != !fit_state)
    CKPT_FAIL("has '" << (step ? "step" : "fit_state") << "' metadata without '" << (step ? "fit_state" : "step")
                      << "'",
              "the file is damaged; use another copy or an earlier checkpoint");
  if (fit_state) {
    const auto fail = [&](const std::string& why) {
      CKPT_FAIL("'fit_state' metadata " << why, "the file is damaged; use another copy or an earlier checkpoint");
    };
    FitState s = parse_fit_state(*fit_state, fail);
    int64_t step_value = -1;
    if (!parse_int(*step, &step_value) || step_value != s.step)
      CKPT_FAIL("'step' metadata '" << *step << "' differs from the fit state's step " << s.step, "");
    if (s.epoch != info.epoch)
      CKPT_FAIL("'epoch' metadata " << info.epoch << " differs from the fit state's epoch " << s.epoch, "");
    info.fit_state = std::move(s);
  }
  // What the recovery ladder changed in the model: its layers in float32 and its loss scaling are the saved
  // model's, so they are applied (step 4) instead of refused as a different model.
  RecoveryModelChanges recovered;
  if (info.fit_state && !info.fit_state->recovery.empty()) {
    try {
      RecoveryGuard().restore_state(info.fit_state->recovery);  // the whole state checked here, not at fit()
      recovered = recovery_model_changes(info.fit_state->recovery);
    } catch (const Error& e) {
      CKPT_FAIL("'fit_state' metadata: " << e.message(), "the file is damaged; use another copy or an earlier checkpoint");
    }
  }
  std::vector<Layer*> to_float32;
  for (const auto& l : model.layers()) {
    const std::string* policy = meta("layer/" + l->name() + "/policy");
    if (policy && *policy != l->dtype_policy().name() && *policy == "float32" &&
        std::find(recovered.float32_layers.begin(), recovered.float32_layers.end(), l->name()) !=
            recovered.float32_layers.end()) {
      to_float32.push_back(l.get());
      continue;
    }
    if (!policy || *policy != l->dtype_policy().name()) {
      CKPT_FAIL("layer '" << l->name() << "' was saved under policy '" << (policy ? *policy : "?")
                          << "' but the model's is '" << l->dtype_policy().name() << "'",
                kRebuildHint);
    }
  }
  const bool mid_epoch = info.fit_state && info.fit_state->step > 0;
  if (mid_epoch != (*format == kCheckpointFormatMidEpoch))
    CKPT_FAIL("format '" << *format << "' does not match its position ("
                         << (mid_epoch ? "inside an epoch" : "an epoch boundary") << ")",
              "the file is damaged; use another copy or an earlier checkpoint");
  info.metadata = file.metadata;
  info.checksums_verified = file.checksums_verified;
  // save_checkpoint never writes NaN or Inf, so one in the file is damage a checksum could not catch (a file of
  // an older version, or edited with its checksum recomputed): refuse it rather than resume from it.
  for (const auto& [key, t] : file.tensors) {
    if (!tensor_is_finite(t))
      CKPT_FAIL("'" << key << "' holds NaN or Inf, which save_checkpoint never writes", "use an earlier checkpoint");
  }

  NamedTensors opt_state;
  for (const auto& [key, t] : file.tensors)
    if (starts_with(key, kOptimizerPrefix)) opt_state.emplace_back(key.substr(kOptimizerPrefix.size()), t);
  const bool restore_optimizer = model.compiled() && !info.optimizer.empty();
  bool enable_loss_scaling = false;  // the recovery ladder switched it on in the run that saved the file
  if (restore_optimizer) {
    const auto [name, is_wrapped] = optimizer_identity(model.optimizer());
    enable_loss_scaling = !is_wrapped && info.loss_scale_optimizer && recovered.enabled_loss_scaling;
    if (name != info.optimizer || (is_wrapped || enable_loss_scaling) != info.loss_scale_optimizer) {
      auto describe = [](const std::string& n, bool w) { return w ? "loss_scale_optimizer(" + n + ")" : n; };
      CKPT_FAIL("saved optimizer " << describe(info.optimizer, info.loss_scale_optimizer)
                                   << " differs from the model's " << describe(name, is_wrapped),
                kRebuildHint);
    }
    if (opt_state.empty()) CKPT_FAIL("metadata names optimizer '" << info.optimizer << "' but no optimizer/ entries", "");
  }

  std::vector<std::vector<uint64_t>> rng_states;
  for (const RngSlot& r : kRngSlots) {
    if (!file.contains(r.key)) CKPT_FAIL("no '" << r.key << "' entry", "pass a file written by save_checkpoint");
    const Tensor& t = file.get(r.key);
    if (t.dtype() != DType::kUInt8 || t.shape() != Shape{4, 8})
      CKPT_FAIL("'" << r.key << "' is " << t.describe() << ", expected uint8 (4, 8)", "");
    rng_states.push_back(decode_rng(t));
    bool all_zero = true;
    for (uint64_t w : rng_states.back()) all_zero = all_zero && w == 0;
    // xoshiro256** never leaves the all-zero state: such an entry is corrupt.
    if (all_zero) CKPT_FAIL("'" << r.key << "' is the all-zero state, which no generator reaches", "");
  }

  // 2. Weights: an unbuilt model is built for the saved input shape first (validation needs its variables).
  if (!model.built()) {
    const std::string* input_shape = meta("input_shape");
    if (!input_shape) CKPT_FAIL("the model is not built and no 'input_shape' metadata says how to build it", "");
    model.build_for(saved_input_shape(path, *input_shape, file));
  }
  const std::vector<Var> weights = model.weights();
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [key, t] : file.tensors) by_name[key] = &t;
  std::vector<Tensor> values;
  std::set<std::string> used;
  for (const Var& w : weights) {
    auto it = by_name.find(w.name());
    if (it == by_name.end()) CKPT_FAIL("no weight '" << w.name() << "' (the model has it)", kRebuildHint);
    const Tensor& t = *it->second;
    if (t.dtype() != w.dtype() || t.shape() != w.shape()) {
      CKPT_FAIL("weight '" << w.name() << "' is " << t.describe() << " but the model's is " << w.value().describe(),
                kRebuildHint);
    }
    values.push_back(t.clone());
    used.insert(w.name());
  }
  for (const auto& [key, t] : file.tensors) {
    if (starts_with(key, kOptimizerPrefix) || starts_with(key, kRngPrefix) || used.count(key)) continue;
    if (starts_with(key, kCallbackPrefix)) {
      // callback/<state key>/<name>, for a callback state the fit state holds.
      const std::string rest = key.substr(kCallbackPrefix.size());
      const size_t slash = rest.find('/');
      CallbackState* state = nullptr;
      if (info.fit_state && slash != std::string::npos && slash + 1 < rest.size())
        for (auto& [state_key, st] : info.fit_state->callbacks)
          if (state_key == rest.substr(0, slash)) state = &st;
      if (!state)
        CKPT_FAIL("'" << key << "' belongs to no callback state of the fit state",
                  "the file is damaged; use another copy or an earlier checkpoint");
      state->tensors.emplace_back(rest.substr(slash + 1), t);
      continue;
    }
    CKPT_FAIL("weight '" << key << "' " << t.describe() << " has no variable in the model", kRebuildHint);
  }

  // 3. Optimizer slots must belong to the model's trainable variables, with their shapes.
  if (restore_optimizer) {
    std::map<std::string, Shape> trainable;
    for (const Var& w : model.trainable_weights()) trainable[w.name()] = w.shape();
    for (const auto& [key, t] : opt_state) {
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
    }
  }

  // 4. Apply. load_state is the only step that can still throw, and it leaves the optimizer unchanged when it does.
  for (Layer* l : to_float32) l->set_dtype_policy(DTypePolicy::from_name("float32"));
  if (enable_loss_scaling) model.enable_dynamic_loss_scaling();
  if (restore_optimizer) {
    try {
      model.optimizer().load_state(opt_state);
    } catch (const Error& e) {
      CKPT_FAIL(e.message(), e.hint());
    }
  }
  for (size_t i = 0; i < weights.size(); ++i) {
    Var w = weights[i];
    w.set_value(values[i]);  // bumps the version, so cached compute-dtype casts refresh
  }
  for (size_t i = 0; i < std::size(kRngSlots); ++i) kRngSlots[i].get(model).set_state(rng_states[i]);
#undef CKPT_FAIL
  if (!info.checksums_verified) {
    // Loaded rather than refused: files saved before checksums were added are otherwise valid and are often the
    // only copy of a long run; every structural and finiteness check above still applied.
    std::cerr << "warning: checkpoint '" << path << "' has no checksums (saved by an older mixtrain), so a damaged "
              << "byte in it cannot be detected; save it again to add them\n";
  }
  return info;
}

CheckpointCallback::CheckpointCallback(std::string path, int period, std::string config, int64_t every_steps)
    : path_(std::move(path)), period_(period), config_(std::move(config)), every_steps_(every_steps) {
  MIXTRAIN_CHECK(!path_.empty(), "CheckpointCallback: path is empty");
  MIXTRAIN_CHECK(period_ > 0, "CheckpointCallback: period must be positive, got " << period_);
  MIXTRAIN_CHECK(every_steps_ >= 0, "CheckpointCallback: every_steps must be >= 0 (0: epoch ends only), got "
                                        << every_steps_);
}

std::string CheckpointCallback::path_for(int completed_epochs) const {
  std::string out = path_;
  const std::string token = "{epoch}", value = std::to_string(completed_epochs);
  for (size_t pos = out.find(token); pos != std::string::npos; pos = out.find(token, pos + value.size()))
    out.replace(pos, token.size(), value);
  return out;
}

void CheckpointCallback::on_train_begin(int epochs, int64_t steps_per_epoch) {
  (void)epochs;
  steps_per_epoch_ = steps_per_epoch;
}

void CheckpointCallback::on_epoch_begin(int epoch) { epoch_ = epoch; }

void CheckpointCallback::on_train_batch_end(int64_t step, const Logs& logs) {
  (void)logs;
  if (every_steps_ == 0) return;
  // The step of the whole data stream, the same in a resumed run as in an uninterrupted one.
  const int64_t global_step = static_cast<int64_t>(epoch_) * steps_per_epoch_ + step;
  if (global_step % every_steps_ != 0) return;
  save(path_for(epoch_ + 1), epoch_, "step " + std::to_string(global_step));
}

void CheckpointCallback::on_epoch_end(int epoch, const Logs& logs) {
  (void)logs;
  const int completed = epoch + 1;
  if (completed % period_ != 0) return;
  save(path_for(completed), completed, "epoch " + std::to_string(completed));
}

void CheckpointCallback::save(const std::string& path, int completed_epochs, const std::string& when) {
  MIXTRAIN_CHECK(model_ != nullptr, "CheckpointCallback: no model (fit() sets it)");
  if (!checkpoint_state_is_finite(*model_)) {
    ++skipped_saves_;
    std::cerr << "warning: " << when << ": weights or optimizer state contain NaN or Inf; checkpoint '" << path
              << "' not written"
              << (last_saved_path_.empty() ? "" : " (the last good one is '" + last_saved_path_ + "')") << "\n";
    return;
  }
  CheckpointInfo info;
  info.epoch = completed_epochs;
  info.config = config_;
  save_checkpoint(path, *model_, info);
  ++saves_;
  last_saved_path_ = path;
}

}  // namespace mixtrain
