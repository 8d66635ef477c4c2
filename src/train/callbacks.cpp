#include "mixtrain/train/callbacks.h"

#include <chrono>
#include <cmath>
#include <ostream>

#include "mixtrain/report/csv_writer.h"
#include "mixtrain/report/progress_bar.h"
#include "mixtrain/train/model.h"

namespace mixtrain {

struct ProgressBarLogger::State {
  std::ostream* out;
  bool interactive;
  int epochs = 0;
  int64_t steps = 0;
  std::unique_ptr<ProgressBar> bar;
  std::chrono::steady_clock::time_point start;
};

ProgressBarLogger::ProgressBarLogger(std::ostream& out, bool interactive) : state_(std::make_unique<State>()) {
  state_->out = &out;
  state_->interactive = interactive;
}
ProgressBarLogger::~ProgressBarLogger() = default;

void ProgressBarLogger::on_train_begin(int epochs, int64_t steps_per_epoch) {
  state_->epochs = epochs;
  state_->steps = steps_per_epoch;
}

void ProgressBarLogger::on_epoch_begin(int epoch) {
  *state_->out << "Epoch " << epoch + 1 << "/" << state_->epochs << "\n";
  state_->bar = std::make_unique<ProgressBar>(state_->steps, *state_->out, state_->interactive);
  state_->start = std::chrono::steady_clock::now();
}

void ProgressBarLogger::on_train_batch_end(int64_t step, const Logs& logs) {
  if (state_->bar) state_->bar->update(step, logs);
}

void ProgressBarLogger::on_epoch_end(int, const Logs& logs) {
  if (!state_->bar) return;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - state_->start).count();
  state_->bar->finish(logs, secs);
  state_->bar.reset();
}

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

EarlyStopping::EarlyStopping(std::string monitor, int patience, double min_delta, bool restore_best_weights)
    : monitor_(std::move(monitor)),
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
  if (++wait_ > patience_) {
    stopped_epoch_ = epoch;
    model_->stop_training = true;
    if (restore_best_weights_ && !best_weights_.empty()) {
      std::vector<Var> ws = model_->weights();
      for (size_t i = 0; i < ws.size(); ++i) ws[i].set_value(best_weights_[i]);
    }
  }
}

void TerminateOnNaN::on_train_batch_end(int64_t, const Logs& logs) {
  if (!std::isfinite(log_value(logs, "loss"))) {
    terminated_ = true;
    model_->stop_training = true;
  }
}

}  // namespace mixtrain
