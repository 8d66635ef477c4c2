// Callbacks, as keras.callbacks: hooks fit() calls at the start and end of training, epochs and steps.
#pragma once

#include <iosfwd>
#include <limits>
#include <memory>
#include <string>

#include "mixtrain/core/tensor.h"
#include "mixtrain/train/history.h"

namespace mixtrain {

class Model;
class CsvWriter;

class Callback {
 public:
  virtual ~Callback() = default;
  // Set by fit() before on_train_begin.
  void set_model(Model* model) { model_ = model; }
  virtual void on_train_begin(int epochs, int64_t steps_per_epoch) {
    (void)epochs;
    (void)steps_per_epoch;
  }
  virtual void on_epoch_begin(int epoch) { (void)epoch; }
  // step is 1-based within the epoch; logs hold the running means of the epoch so far.
  virtual void on_train_batch_end(int64_t step, const Logs& logs) {
    (void)step;
    (void)logs;
  }
  virtual void on_epoch_end(int epoch, const Logs& logs) {
    (void)epoch;
    (void)logs;
  }
  virtual void on_train_end(const Logs& logs) { (void)logs; }

 protected:
  Model* model_ = nullptr;
};

// Keras-like progress bar: step counter, ETA, running loss and metrics; one line per epoch when the
// output is not a terminal.
class ProgressBarLogger : public Callback {
 public:
  explicit ProgressBarLogger(std::ostream& out, bool interactive);
  ~ProgressBarLogger() override;
  void on_train_begin(int epochs, int64_t steps_per_epoch) override;
  void on_epoch_begin(int epoch) override;
  void on_train_batch_end(int64_t step, const Logs& logs) override;
  void on_epoch_end(int epoch, const Logs& logs) override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Writes one CSV row per epoch: epoch, then every log value (header from the first epoch's keys).
class CSVLogger : public Callback {
 public:
  explicit CSVLogger(std::string path);
  ~CSVLogger() override;
  void on_epoch_end(int epoch, const Logs& logs) override;

 private:
  std::string path_;
  std::vector<std::string> keys_;
  std::unique_ptr<CsvWriter> writer_;
};

// Stops training when `monitor` has not improved by min_delta for `patience` epochs; optionally
// restores the weights of the best epoch.
class EarlyStopping : public Callback {
 public:
  explicit EarlyStopping(std::string monitor = "val_loss", int patience = 0, double min_delta = 0.0,
                         bool restore_best_weights = false);
  void on_train_begin(int epochs, int64_t steps_per_epoch) override;
  void on_epoch_end(int epoch, const Logs& logs) override;
  int stopped_epoch() const { return stopped_epoch_; }  // -1 when it never stopped training

 private:
  std::string monitor_;
  int patience_;
  double min_delta_;
  bool restore_best_weights_;
  bool maximize_;
  double best_;
  int wait_ = 0;
  int stopped_epoch_ = -1;
  std::vector<Tensor> best_weights_;
};

// Stops training as soon as a step's loss is NaN or infinite.
class TerminateOnNaN : public Callback {
 public:
  void on_train_batch_end(int64_t step, const Logs& logs) override;
  bool terminated() const { return terminated_; }

 private:
  bool terminated_ = false;
};

}  // namespace mixtrain
