// The recovery ladder's state in a checkpoint (RecoveryGuard::state_json / restore_state), and what it changed in
// the model (recovery_model_changes), so a recovered run that is killed resumes with its float32 layers, its loss
// scaling and its record of actions.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include "mixtrain/core/error.h"
#include "mixtrain/core/json.h"
#include "mixtrain/train/exact_json.h"
#include "mixtrain/train/recovery.h"

namespace mixtrain {

namespace {

const char* const kActions[] = {"enable_loss_scaling", "rollback", "layers_to_bfloat16", "layers_to_float32",
                                "model_to_float32", "give_up"};

Json parse_object(const std::string& text) {
  Json j = Json::parse(text, "recovery state");
  MIXTRAIN_CHECK(j.is_object(), "recovery state: " << j.type_name() << " where an object belongs");
  return j;
}

const Json& member(const Json& obj, const char* key) {
  const Json* v = obj.find(key);
  MIXTRAIN_CHECK(v != nullptr, "recovery state: no '" << key << "'");
  return *v;
}

double number(const Json& obj, const char* key) { return read_exact_member(obj, key, "recovery state"); }

int64_t integer(const Json& obj, const char* key, int64_t min) {
  return read_exact_integer(obj, key, min, int64_t{1} << 53, "recovery state");
}

bool boolean(const Json& obj, const char* key) {
  const Json& v = member(obj, key);
  MIXTRAIN_CHECK(v.is_bool(), "recovery state: '" << key << "' is " << v.dump() << ", expected true or false");
  return v.as_bool();
}

std::vector<RecoveryEvent> parse_events(const Json& j) {
  const Json& events = member(j, "events");
  MIXTRAIN_CHECK(events.is_array(), "recovery state: 'events' is not an array");
  std::vector<RecoveryEvent> out;
  for (const Json& e : events.as_array()) {
    MIXTRAIN_CHECK(e.is_object(), "recovery state: an event is " << e.dump());
    RecoveryEvent ev;
    ev.step = integer(e, "step", 0);
    const Json& action = member(e, "action");
    MIXTRAIN_CHECK(action.is_string() && std::find(std::begin(kActions), std::end(kActions), action.as_string()) !=
                                             std::end(kActions),
                   "recovery state: unknown action " << action.dump());
    ev.action = action.as_string();
    const Json& reason = member(e, "reason");
    MIXTRAIN_CHECK(reason.is_string(), "recovery state: an event's reason is " << reason.dump());
    ev.reason = reason.as_string();
    const Json& layers = member(e, "layers");
    MIXTRAIN_CHECK(layers.is_array(), "recovery state: an event's layers are " << layers.dump());
    for (const Json& l : layers.as_array()) {
      MIXTRAIN_CHECK(l.is_string() && !l.as_string().empty(), "recovery state: a layer name is " << l.dump());
      ev.layers.push_back(l.as_string());
    }
    ev.resume_step = integer(e, "resume_step", -1);
    out.push_back(std::move(ev));
  }
  return out;
}

}  // namespace

std::string RecoveryGuard::state_json() const {
  Json j = Json::object();
  j["rung"] = rung_;
  j["gave_up"] = gave_up_;
  j["consecutive_failures"] = consecutive_failures_;
  j["drifting_steps"] = drifting_steps_;
  j["ema"] = exact_number(ema_);
  j["reference_ema"] = exact_number(reference_ema_);
  j["has_ema"] = has_ema_;
  j["has_reference_ema"] = has_reference_ema_;
  Json events = Json::array();
  for (const RecoveryEvent& e : events_) {
    Json ev = Json::object();
    ev["step"] = e.step;
    ev["action"] = e.action;
    ev["reason"] = e.reason;
    Json layers = Json::array();
    for (const std::string& l : e.layers) layers.push_back(l);
    ev["layers"] = layers;
    ev["resume_step"] = e.resume_step;
    events.push_back(ev);
  }
  j["events"] = events;
  return j.dump();
}

void RecoveryGuard::restore_state(const std::string& json) {
  const Json j = parse_object(json);
  const int64_t rung = integer(j, "rung", 0);
  MIXTRAIN_CHECK(rung <= 3, "recovery state: 'rung' is " << rung << ", expected 0 to 3");
  std::vector<RecoveryEvent> events = parse_events(j);
  // Everything read before anything is set: a malformed state leaves the guard as it was.
  const bool gave_up = boolean(j, "gave_up");
  const int64_t failures = integer(j, "consecutive_failures", 0), drifting = integer(j, "drifting_steps", 0);
  const double ema = number(j, "ema"), reference_ema = number(j, "reference_ema");
  const bool has_ema = boolean(j, "has_ema"), has_reference_ema = boolean(j, "has_reference_ema");
  rung_ = static_cast<int>(rung);
  gave_up_ = gave_up;
  consecutive_failures_ = failures;
  drifting_steps_ = drifting;
  ema_ = ema;
  reference_ema_ = reference_ema;
  has_ema_ = has_ema;
  has_reference_ema_ = has_reference_ema;
  events_ = std::move(events);
}

RecoveryModelChanges recovery_model_changes(const std::string& state_json) {
  RecoveryModelChanges c;
  std::set<std::string> seen;
  std::vector<std::string> bfloat16;  // in the order moved; those later moved on to float32 are left out below
  for (const RecoveryEvent& e : parse_events(parse_object(state_json))) {
    if (e.action == "enable_loss_scaling") c.enabled_loss_scaling = true;
    if (e.action == "layers_to_bfloat16") bfloat16.insert(bfloat16.end(), e.layers.begin(), e.layers.end());
    if (e.action != "layers_to_float32" && e.action != "model_to_float32") continue;
    for (const std::string& l : e.layers)
      if (seen.insert(l).second) c.float32_layers.push_back(l);
  }
  for (const std::string& l : bfloat16)
    if (!seen.count(l) && std::find(c.bfloat16_layers.begin(), c.bfloat16_layers.end(), l) == c.bfloat16_layers.end())
      c.bfloat16_layers.push_back(l);
  return c;
}

}  // namespace mixtrain
