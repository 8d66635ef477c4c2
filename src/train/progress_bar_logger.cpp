#include "mixtrain/train/progress_bar_logger.h"

#include <chrono>
#include <ostream>

#include "mixtrain/report/progress_bar.h"

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

void ProgressBarLogger::on_train_interrupted(int, int64_t) {
  // A bar redrawn in place ends its line, so what is printed next starts on its own.
  if (state_->bar && state_->interactive) *state_->out << "\n";
  state_->bar.reset();
}

}  // namespace mixtrain
