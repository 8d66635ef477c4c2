#include "mixtrain/train/callbacks.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <optional>
#include <ostream>
#include <utility>

#include "mixtrain/core/json.h"
#include "mixtrain/report/csv_writer.h"
#include "mixtrain/train/exact_json.h"
#include "mixtrain/train/model.h"

namespace mixtrain {

CSVLogger::CSVLogger(std::string path) : path_(std::move(path)) {}
CSVLogger::~CSVLogger() = default;

void CSVLogger::on_epoch_end(int epoch, const Logs& logs) {
  if (!writer_) {
    std::vector<std::string> header{"epoch"};
    for (auto& [k, v] : logs) {
      keys_.push_back(k);
      header.push_back(k);
    }
    writer_ = std::make_unique<CsvWriter>(path_, header);
  }
  std::vector<std::string> row{std::to_string(epoch)};
  for (const std::string& k : keys_) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9g", log_value(logs, k, NAN));
    row.emplace_back(buf);
  }
  writer_->row(row);
}

EarlyStopping::EarlyStopping(std::string_view monitor, int patience, double min_delta, bool restore_best_weights)
    : monitor_(monitor),
      patience_(patience),
      min_delta_(std::fabs(min_delta)),
      restore_best_weights_(restore_best_weights),
      // Accuracy-like quantities improve upward, losses downward (Keras' "auto" mode).
      maximize_(monitor_.find("acc") != std::string::npos),
      best_(maximize_ ? -INFINITY : INFINITY) {}

void EarlyStopping::on_train_begin(int, int64_t) {
  wait_ = 0;
  stopped_epoch_ = -1;
  best_ = maximize_ ? -INFINITY : INFINITY;
  best_weights_.clear();
}

void EarlyStopping::on_epoch_end(int epoch, const Logs& logs) {
  MIXTRAIN_CHECK(has_log(logs, monitor_), "EarlyStopping: metric '" << monitor_
                                                                    << "' is not logged (is validation data given?)");
  const double v = log_value(logs, monitor_);
  const bool improved = maximize_ ? v > best_ + min_delta_ : v < best_ - min_delta_;
  if (improved) {
    best_ = v;
    wait_ = 0;
    if (restore_best_weights_) {
      best_weights_.clear();
      for (const Var& w : model_->weights()) best_weights_.push_back(w.value().clone());
    }
    return;
  }
  // The patience-th epoch in a row without improvement stops training, as Keras 3 counts (wait >= patience):
  // patience 2 stops after two such epochs, 0 and 1 both after the first.
  if (++wait_ >= patience_) {
    stopped_epoch_ = epoch;
    model_->stop_training = true;
    if (restore_best_weights_ && !best_weights_.empty()) {
      std::vector<Var> ws = model_->weights();
      for (size_t i = 0; i < ws.size(); ++i) ws[i].set_value(best_weights_[i]);
    }
  }
}

namespace {

// A callback's saved state as a JSON object; Error naming the callback when it is not one.
Json parse_state(const CallbackState& state, const char* callback) {
  Json j = Json::parse(state.json, std::string(callback) + " state");
  MIXTRAIN_CHECK(j.is_object(), callback << ": the saved state is " << j.type_name() << ", expected an object");
  return j;
}

// A counter of a saved state: a whole number from min up to the largest int.
int saved_int(const Json& j, const char* key, int min, const char* what) {
  return static_cast<int>(read_exact_integer(j, key, min, std::numeric_limits<int>::max(), what));
}

}  // namespace

CallbackState EarlyStopping::state() const {
  CallbackState s;
  Json j = Json::object();
  j["best"] = exact_number(best_);
  j["wait"] = wait_;
  j["stopped_epoch"] = stopped_epoch_;
  s.json = j.dump();
  // The best weights in the order of model_->weights(), named as they are (the names are unique in a model).
  if (!best_weights_.empty()) {
    const std::vector<Var> ws = model_->weights();
    for (size_t i = 0; i < ws.size(); ++i) s.tensors.emplace_back(ws[i].name(), best_weights_[i]);
  }
  return s;
}

void EarlyStopping::restore_state(const CallbackState& state) {
  const Json j = parse_state(state, "EarlyStopping");
  const double best = read_exact_member(j, "best", "EarlyStopping state");
  const int wait = saved_int(j, "wait", 0, "EarlyStopping state");
  const int stopped = saved_int(j, "stopped_epoch", -1, "EarlyStopping state");
  std::vector<Tensor> best_weights;
  // Saved by a callback that kept them; a resumed one that does not restore weights has no use for them.
  if (restore_best_weights_ && !state.tensors.empty()) {
    const std::vector<Var> ws = model_->weights();
    MIXTRAIN_CHECK(state.tensors.size() == ws.size(), "EarlyStopping: the saved state holds "
                                                          << state.tensors.size() << " best weights for a model of "
                                                          << ws.size());
    for (const Var& w : ws) {
      const auto it = std::find_if(state.tensors.begin(), state.tensors.end(),
                                   [&](const auto& named) { return named.first == w.name(); });
      MIXTRAIN_CHECK(it != state.tensors.end(), "EarlyStopping: the saved state has no best value of weight '"
                                                    << w.name() << "'");
      MIXTRAIN_CHECK(it->second.dtype() == w.dtype() && it->second.shape() == w.shape(),
                     "EarlyStopping: saved best weight '" << w.name() << "' is " << it->second.describe()
                                                          << " but the model's is " << w.value().describe());
      best_weights.push_back(it->second.clone());
    }
  }
  best_ = best;
  wait_ = wait;
  stopped_epoch_ = stopped;
  best_weights_ = std::move(best_weights);
}

namespace {

// Sets key in logs, replacing an entry of that name (two learning-rate callbacks record one "learning_rate").
void set_log(Logs& logs, const std::string& key, double value) {
  for (auto& [k, v] : logs) {
    if (k == key) {
      v = value;
      return;
    }
  }
  logs.emplace_back(key, value);
}

Optimizer& optimizer_of(Model* model, const char* callback) {
  MIXTRAIN_CHECK(model != nullptr, callback << ": no model; pass the callback to fit()");
  return model->optimizer();
}

}  // namespace

LearningRateScheduler::LearningRateScheduler(std::function<float(int, float)> schedule, int verbose,
                                             std::ostream* out)
    : schedule_(std::move(schedule)), verbose_(verbose), out_(out != nullptr ? out : &std::cout) {
  MIXTRAIN_CHECK(static_cast<bool>(schedule_), "LearningRateScheduler: the schedule function is empty");
}

void LearningRateScheduler::on_epoch_begin(int epoch) {
  Optimizer& opt = optimizer_of(model_, "LearningRateScheduler");
  const float current = opt.learning_rate();
  const float lr = schedule_(epoch, current);
  if (!(std::isfinite(lr) && lr >= 0.0f)) {
    MIXTRAIN_FAIL(kInvalidInput,
                  "LearningRateScheduler: schedule(epoch " << epoch << ", lr " << current << ") returned " << lr,
                  "the schedule must return a finite learning rate >= 0");
  }
  opt.set_learning_rate(lr);  // throws when a LearningRateSchedule owns the rate
  if (verbose_ > 0) {
    *out_ << "\nEpoch " << epoch + 1 << ": LearningRateScheduler setting learning rate to " << lr << ".\n";
  }
}

void LearningRateScheduler::on_epoch_logs(int, Logs& logs) {
  set_log(logs, "learning_rate", optimizer_of(model_, "LearningRateScheduler").learning_rate());
}

ReduceLROnPlateau::ReduceLROnPlateau(ReduceLROnPlateauOptions options) : options_(std::move(options)) {
  const ReduceLROnPlateauOptions& o = options_;
  // Keras: "ReduceLROnPlateau does not support a factor >= 1.0."
  MIXTRAIN_CHECK(o.factor >= 0.0 && o.factor < 1.0, "ReduceLROnPlateau: factor must be in [0, 1), got " << o.factor);
  MIXTRAIN_CHECK(o.patience >= 0, "ReduceLROnPlateau: patience must be >= 0, got " << o.patience);
  MIXTRAIN_CHECK(o.cooldown >= 0, "ReduceLROnPlateau: cooldown must be >= 0, got " << o.cooldown);
  MIXTRAIN_CHECK(std::isfinite(o.min_delta), "ReduceLROnPlateau: min_delta must be finite, got " << o.min_delta);
  MIXTRAIN_CHECK(std::isfinite(o.min_lr) && o.min_lr >= 0.0,
                 "ReduceLROnPlateau: min_lr must be finite and >= 0, got " << o.min_lr);
  if (o.mode != "auto" && o.mode != "min" && o.mode != "max") {
    MIXTRAIN_FAIL(kInvalidInput, "ReduceLROnPlateau: unknown mode '" << o.mode << "'; valid modes: auto, min, max",
                  "use \"min\" for losses, \"max\" for accuracies, or \"auto\" to choose by the monitor's name");
  }
  if (options_.out == nullptr) options_.out = &std::cout;
  // Keras' "auto": accuracy-like quantities improve upward, everything else downward.
  maximize_ = o.mode == "max" || (o.mode == "auto" && o.monitor.find("acc") != std::string::npos);
  reset();
}

void ReduceLROnPlateau::reset() {
  best_ = maximize_ ? -INFINITY : INFINITY;
  wait_ = 0;
  cooldown_counter_ = 0;
}

bool ReduceLROnPlateau::improved(double current) const {
  return maximize_ ? current > best_ + options_.min_delta : current < best_ - options_.min_delta;
}

void ReduceLROnPlateau::on_train_begin(int, int64_t) { reset(); }

// The rate itself is in the optimizer's state, which the checkpoint restores.
CallbackState ReduceLROnPlateau::state() const {
  Json j = Json::object();
  j["best"] = exact_number(best_);
  j["wait"] = wait_;
  j["cooldown_counter"] = cooldown_counter_;
  return {j.dump(), {}};
}

void ReduceLROnPlateau::restore_state(const CallbackState& state) {
  const Json j = parse_state(state, "ReduceLROnPlateau");
  const double best = read_exact_member(j, "best", "ReduceLROnPlateau state");
  const int wait = saved_int(j, "wait", 0, "ReduceLROnPlateau state");
  const int cooldown = saved_int(j, "cooldown_counter", 0, "ReduceLROnPlateau state");
  best_ = best;
  wait_ = wait;
  cooldown_counter_ = cooldown;
}

void ReduceLROnPlateau::on_epoch_logs(int, Logs& logs) {
  // The rate this epoch trained with: recorded before on_epoch_end may reduce it, as Keras does.
  set_log(logs, "learning_rate", optimizer_of(model_, "ReduceLROnPlateau").learning_rate());
}

void ReduceLROnPlateau::on_epoch_end(int epoch, const Logs& logs) {
  if (!has_log(logs, options_.monitor)) {
    std::string available;
    for (const auto& [k, v] : logs) available += (available.empty() ? "" : ", ") + k;
    MIXTRAIN_FAIL(kInvalidInput,
                  "ReduceLROnPlateau: the monitored metric '" << options_.monitor
                                                              << "' is not logged; available metrics: " << available,
                  "monitor one of those (val_* needs validation data)");
  }
  const double current = log_value(logs, options_.monitor);
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    wait_ = 0;
  }
  if (improved(current)) {
    best_ = current;
    wait_ = 0;
    return;
  }
  if (cooldown_counter_ > 0 || ++wait_ < options_.patience) return;
  Optimizer& opt = optimizer_of(model_, "ReduceLROnPlateau");
  const float old_lr = opt.learning_rate();
  // Keras compares the float32 rate with float32(min_lr), computes the new rate in double and stores float32.
  if (!(old_lr > static_cast<float>(options_.min_lr))) return;
  const double new_lr = std::max(static_cast<double>(old_lr) * options_.factor, options_.min_lr);
  opt.set_learning_rate(static_cast<float>(new_lr));  // throws when a LearningRateSchedule owns the rate
  if (options_.verbose > 0) {
    *options_.out << "\nEpoch " << epoch + 1 << ": ReduceLROnPlateau reducing learning rate to " << new_lr << ".\n";
  }
  cooldown_counter_ = options_.cooldown;
  wait_ = 0;
}

void TerminateOnNaN::on_train_batch_end(int64_t, const Logs& logs) {
  if (!std::isfinite(log_value(logs, "loss"))) {
    terminated_ = true;
    model_->stop_training = true;
  }
}

}  // namespace mixtrain
