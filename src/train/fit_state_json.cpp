#include "fit_state_json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>

#include "mixtrain/core/error.h"
#include "mixtrain/core/json.h"
#include "mixtrain/train/exact_json.h"

namespace mixtrain::detail {

namespace {

std::string hex_word(uint64_t w) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(w));
  return buf;
}

}  // namespace

std::string fit_state_json(const FitState& s) {
  Json j = Json::object();
  j["epoch"] = s.epoch;
  j["step"] = s.step;
  j["steps_per_epoch"] = s.steps_per_epoch;
  j["batch_size"] = s.batch_size;
  // Only when accumulating: other states read as before.
  if (s.gradient_accumulation_steps != 1) j["gradient_accumulation_steps"] = s.gradient_accumulation_steps;
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

namespace {

// Reads members of the fit state's JSON; fail(why) throws on anything malformed.
class FitStateReader {
 public:
  explicit FitStateReader(const std::function<void(const std::string&)>& fail) : fail_(fail) {}
  void fail(const std::string& why) const { fail_(why); }

  const Json& member(const Json& obj, const char* key) const {
    const Json* v = obj.is_object() ? obj.find(key) : nullptr;
    if (!v) fail(std::string("has no '") + key + "'");
    return *v;
  }
  int64_t integer(const Json& obj, const char* key, int64_t min) const {
    const Json& v = member(obj, key);
    if (!v.is_number() || v.as_number() != std::floor(v.as_number()) || std::fabs(v.as_number()) > 9007199254740992.0 ||
        v.as_int64() < min)
      fail(std::string("'") + key + "' is " + v.dump() + ", expected an integer >= " + std::to_string(min));
    return v.as_int64();
  }
  bool boolean(const Json& obj, const char* key) const {
    const Json& v = member(obj, key);
    if (!v.is_bool()) fail(std::string("'") + key + "' is " + v.dump() + ", expected true or false");
    return v.as_bool();
  }
  double number(const Json& v, const std::string& where) const {
    const std::optional<double> d = read_exact_number(v);
    if (!d) fail(where + " holds " + v.dump() + ", expected a number");
    return *d;
  }
  std::vector<double> numbers(const Json& obj, const char* key) const {
    const Json& v = member(obj, key);
    if (!v.is_array()) fail(std::string("'") + key + "' is not an array");
    std::vector<double> out;
    for (const Json& e : v.as_array()) out.push_back(number(e, std::string("'") + key + "'"));
    return out;
  }

 private:
  const std::function<void(const std::string&)>& fail_;
};

// The epoch, the step within it and the shape of the data stream.
void read_position(const FitStateReader& r, const Json& j, FitState& s) {
  const int64_t epoch = r.integer(j, "epoch", 0);
  if (epoch > std::numeric_limits<int>::max()) r.fail("'epoch' " + std::to_string(epoch) + " is out of range");
  s.epoch = static_cast<int>(epoch);
  s.step = r.integer(j, "step", 0);
  s.steps_per_epoch = r.integer(j, "steps_per_epoch", 1);
  if (s.step > s.steps_per_epoch)
    r.fail("'step' " + std::to_string(s.step) + " is past the epoch's " + std::to_string(s.steps_per_epoch) + " steps");
  s.batch_size = r.integer(j, "batch_size", 1);
  if (j.find("gradient_accumulation_steps"))
    s.gradient_accumulation_steps = r.integer(j, "gradient_accumulation_steps", 1);
  s.rows = r.integer(j, "rows", 1);
  s.shuffle = r.boolean(j, "shuffle");
  s.sampled = r.boolean(j, "sampled");
}

// The shuffle state the epoch in progress drew its order from: four words of 16 hex digits, or none.
void read_epoch_shuffle_state(const FitStateReader& r, const Json& j, FitState& s) {
  const Json& words = r.member(j, "epoch_shuffle_state");
  if (!words.is_array() || (words.size() != 0 && words.size() != 4))
    r.fail("'epoch_shuffle_state' is not an array of 0 or 4 words");
  for (const Json& w : words.as_array()) {
    uint64_t v = 0;
    if (!w.is_string() || w.as_string().size() != 16) r.fail("'epoch_shuffle_state' holds " + w.dump());
    const std::string& t = w.as_string();
    const auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), v, 16);
    if (ec != std::errc() || ptr != t.data() + t.size()) r.fail("'epoch_shuffle_state' holds " + w.dump());
    s.epoch_shuffle_state.push_back(v);
  }
  if (s.step > 0 && s.epoch_shuffle_state.size() != 4)
    r.fail("'epoch_shuffle_state' is missing for an epoch in progress (step " + std::to_string(s.step) + ")");
  const auto is_zero = [](uint64_t w) { return w == 0; };
  if (s.step > 0 && std::all_of(s.epoch_shuffle_state.begin(), s.epoch_shuffle_state.end(), is_zero))
    r.fail("'epoch_shuffle_state' is the all-zero state, which no generator reaches");
}

// The epoch's running sums and the rows they cover.
void read_running_sums(const FitStateReader& r, const Json& j, FitState& s) {
  const Json& sums = r.member(j, "sums");
  if (!sums.is_array()) r.fail("'sums' is not an array");
  for (const Json& e : sums.as_array()) {
    if (!e.is_array() || e.size() != 2 || !e.at(size_t{0}).is_string()) r.fail("'sums' holds " + e.dump());
    s.sums.emplace_back(e.at(size_t{0}).as_string(), r.number(e.at(size_t{1}), "'sums'"));
  }
  s.seen = r.integer(j, "seen", 0);
}

void read_history(const FitStateReader& r, const Json& h, History& hist) {
  const Json& epochs = r.member(h, "epoch");
  if (!epochs.is_array()) r.fail("'history.epoch' is not an array");
  for (const Json& e : epochs.as_array()) {
    if (!e.is_number() || e.as_number() != std::floor(e.as_number()) || e.as_number() < 0 ||
        e.as_number() > std::numeric_limits<int>::max())
      r.fail("'history.epoch' holds " + e.dump());
    hist.epoch.push_back(static_cast<int>(e.as_number()));
  }
  const Json& metrics = r.member(h, "history");
  if (!metrics.is_object()) r.fail("'history.history' is not an object");
  for (const auto& [key, v] : metrics.as_object()) hist.history[key] = r.numbers(metrics, key.c_str());
  hist.step_loss = r.numbers(h, "step_loss");
  hist.epoch_seconds = r.numbers(h, "epoch_seconds");
  hist.step_loss_scale = r.numbers(h, "step_loss_scale");
  hist.steps = r.integer(h, "steps", 0);
  hist.samples = r.integer(h, "samples", 0);
  hist.train_seconds = r.number(r.member(h, "train_seconds"), "'train_seconds'");
}

// The recovery ladder's and the callbacks' own states.
void read_saved_states(const FitStateReader& r, const Json& j, FitState& s) {
  // Both absent from files saved before callbacks and the recovery ladder kept state: they resume with none.
  if (const Json* rec = j.find("recovery")) {
    if (!rec->is_object()) r.fail("'recovery' is " + rec->dump() + ", expected an object");
    s.recovery = rec->dump();
  }
  if (const Json* cbs = j.find("callbacks")) {
    if (!cbs->is_object()) r.fail("'callbacks' is not an object");
    for (const auto& [key, state] : cbs->as_object()) {
      if (key.empty() || key.find('/') != std::string::npos || !state.is_object())
        r.fail("'callbacks' holds '" + key + "': " + state.dump());
      s.callbacks.emplace_back(key, CallbackState{state.dump(), {}});
    }
  }
}

// Every epoch of the History has its time and a value of every metric.
void check_history_lengths(const FitStateReader& r, const History& hist) {
  if (hist.epoch_seconds.size() != hist.epoch.size())
    r.fail("'history' records " + std::to_string(hist.epoch.size()) + " epochs but " +
           std::to_string(hist.epoch_seconds.size()) + " epoch times");
  for (const auto& [key, v] : hist.history)
    if (v.size() != hist.epoch.size())
      r.fail("'history." + key + "' holds " + std::to_string(v.size()) + " values for " +
             std::to_string(hist.epoch.size()) + " epochs");
}

}  // namespace

FitState parse_fit_state(const std::string& text, const std::function<void(const std::string&)>& fail) {
  Json j;
  try {
    j = Json::parse(text, "fit_state");
  } catch (const Error& e) {
    fail("is not JSON: " + e.message());
  }
  const FitStateReader r(fail);
  FitState s;
  read_position(r, j, s);
  read_epoch_shuffle_state(r, j, s);
  read_running_sums(r, j, s);
  read_history(r, r.member(j, "history"), s.history);
  read_saved_states(r, j, s);
  check_history_lengths(r, s.history);
  return s;
}

}  // namespace mixtrain::detail
