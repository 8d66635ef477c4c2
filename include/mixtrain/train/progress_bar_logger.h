// ProgressBarLogger: the callback behind fit()'s verbose output. It reads only the logs, never the model.
#pragma once

#include <iosfwd>
#include <memory>

#include "mixtrain/train/callback.h"

namespace mixtrain {

// Keras-like progress bar: step counter, ETA, running loss and metrics; one line per epoch when the
// output is not a terminal. fit() adds one for FitOptions::verbose unless its callbacks already hold one.
class ProgressBarLogger : public Callback {
 public:
  explicit ProgressBarLogger(std::ostream& out, bool interactive);
  ~ProgressBarLogger() override;
  void on_train_begin(int epochs, int64_t steps_per_epoch) override;
  void on_epoch_begin(int epoch) override;
  void on_train_batch_end(int64_t step, const Logs& logs) override;
  void on_epoch_end(int epoch, const Logs& logs) override;
  void on_train_interrupted(int epoch, int64_t steps_done) override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace mixtrain
