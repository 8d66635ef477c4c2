// The callbacks of keras.callbacks that act on the model (Callback, the interface fit() calls, is train/callback.h).
#pragma once

#include <functional>
#include <iosfwd>
#include <limits>
#include <memory>
#include <string>
#include <string_view>

#include "mixtrain/core/tensor.h"
#include "mixtrain/train/callback.h"
#include "mixtrain/train/fit_state.h"
#include "mixtrain/train/history.h"
#include "mixtrain/train/progress_bar_logger.h"

namespace mixtrain {

class CsvWriter;

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

// keras.callbacks.EarlyStopping's arguments and defaults, in Keras' order.
struct EarlyStoppingOptions {
  std::string monitor = "val_loss";  // "max" direction when the name contains "acc", as Keras' "auto" mode
  double min_delta = 0.0;            // an improvement must beat the best by more than this
  int patience = 0;                  // epochs without improvement before training stops
  bool restore_best_weights = false;

  // Chained setters, in any order: `EarlyStoppingOptions().with_patience(2).with_monitor("val_accuracy")`.
  EarlyStoppingOptions& with_monitor(std::string v) { monitor = std::move(v); return *this; }
  EarlyStoppingOptions& with_min_delta(double v) { min_delta = v; return *this; }
  EarlyStoppingOptions& with_patience(int v) { patience = v; return *this; }
  EarlyStoppingOptions& with_restore_best_weights(bool v) { restore_best_weights = v; return *this; }
};

// Stops training when `monitor` has not improved by min_delta for `patience` epochs; optionally
// restores the weights of the best epoch.
class EarlyStopping : public Callback {
 public:
  // monitor is a string_view so that GCC 12 does not take a braced EarlyStoppingOptions for a std::string.
  explicit EarlyStopping(std::string_view monitor = "val_loss", int patience = 0, double min_delta = 0.0,
                         bool restore_best_weights = false);
  // The same by name: `EarlyStopping({.patience = 2, .restore_best_weights = true})`.
  explicit EarlyStopping(const EarlyStoppingOptions& options)
      : EarlyStopping(options.monitor, options.patience, options.min_delta, options.restore_best_weights) {}
  int patience() const { return patience_; }
  bool restore_best_weights() const { return restore_best_weights_; }
  const std::string& monitor() const { return monitor_; }
  void on_train_begin(int epochs, int64_t steps_per_epoch) override;
  void on_epoch_end(int epoch, const Logs& logs) override;
  int stopped_epoch() const { return stopped_epoch_; }  // -1 when it never stopped training
  // The best value, the epochs waited, and the best weights when they are to be restored.
  std::string state_key() const override { return "EarlyStopping"; }
  CallbackState state() const override;
  void restore_state(const CallbackState& state) override;

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

// keras.callbacks.LearningRateScheduler: at the start of every epoch, sets the optimizer's learning rate to
// schedule(epoch, current rate) (epoch 0-based and absolute, so a run resumed at initial_epoch k continues the
// same curve), and records the rate as "learning_rate" in the epoch's logs. verbose 1 prints
// "Epoch N: LearningRateScheduler setting learning rate to X." to `out` (std::cout when null). Throws Error when
// schedule returns a rate that is not finite and >= 0, or when the optimizer has a LearningRateSchedule (its
// rate cannot be set; Keras refuses too).
class LearningRateScheduler : public Callback {
 public:
  explicit LearningRateScheduler(std::function<float(int epoch, float lr)> schedule, int verbose = 0,
                                 std::ostream* out = nullptr);
  void on_epoch_begin(int epoch) override;
  // The rate set at this epoch's start is in the restored optimizer state: calling schedule again would apply a
  // rate-dependent schedule (lr * 0.9) twice.
  void on_epoch_resume(int epoch, int64_t steps_done) override {
    (void)epoch;
    (void)steps_done;
  }
  void on_epoch_logs(int epoch, Logs& logs) override;

 private:
  std::function<float(int, float)> schedule_;
  int verbose_;
  std::ostream* out_;
};

// keras.callbacks.ReduceLROnPlateau's arguments and defaults.
struct ReduceLROnPlateauOptions {
  std::string monitor = "val_loss";
  double factor = 0.1;        // new rate = rate * factor; in [0, 1)
  int patience = 10;          // epochs without improvement before a reduction
  int verbose = 0;            // 1: print "Epoch N: ReduceLROnPlateau reducing learning rate to X."
  std::string mode = "auto";  // "min", "max", or "auto": "max" when the monitor's name contains "acc"
  double min_delta = 1e-4;    // an improvement must beat the best by more than this
  int cooldown = 0;           // epochs after a reduction during which no epoch counts as waiting
  double min_lr = 0.0;        // the rate is never reduced below this
  std::ostream* out = nullptr;  // where verbose messages go; std::cout when null

  // Chained setters, in any order: `ReduceLROnPlateauOptions().with_patience(1).with_factor(0.5)`.
  ReduceLROnPlateauOptions& with_monitor(std::string v) { monitor = std::move(v); return *this; }
  ReduceLROnPlateauOptions& with_factor(double v) { factor = v; return *this; }
  ReduceLROnPlateauOptions& with_patience(int v) { patience = v; return *this; }
  ReduceLROnPlateauOptions& with_verbose(int v) { verbose = v; return *this; }
  ReduceLROnPlateauOptions& with_mode(std::string v) { mode = std::move(v); return *this; }
  ReduceLROnPlateauOptions& with_min_delta(double v) { min_delta = v; return *this; }
  ReduceLROnPlateauOptions& with_cooldown(int v) { cooldown = v; return *this; }
  ReduceLROnPlateauOptions& with_min_lr(double v) { min_lr = v; return *this; }
  ReduceLROnPlateauOptions& with_out(std::ostream* v) { out = v; return *this; }
};

// keras.callbacks.ReduceLROnPlateau: multiplies the learning rate by factor (not below min_lr) once `monitor`
// has not improved for `patience` epochs, then waits `cooldown` epochs before counting again. Each epoch's
// logs get "learning_rate", the rate that epoch trained with (read before any reduction, as Keras). State is
// reset at the start of every fit(). Throws Error on invalid options (Keras warns and falls back to "auto" for
// an unknown mode; here it is refused), when the monitored value is not logged (listing what is), or when the
// optimizer has a LearningRateSchedule and a reduction is due.
class ReduceLROnPlateau : public Callback {
 public:
  explicit ReduceLROnPlateau(ReduceLROnPlateauOptions options = {});
  void on_train_begin(int epochs, int64_t steps_per_epoch) override;
  void on_epoch_logs(int epoch, Logs& logs) override;
  void on_epoch_end(int epoch, const Logs& logs) override;
  std::string state_key() const override { return "ReduceLROnPlateau"; }
  CallbackState state() const override;
  void restore_state(const CallbackState& state) override;

  const ReduceLROnPlateauOptions& options() const { return options_; }
  // Keras' counters: epochs waited without improvement, cooldown epochs left, and the best value seen.
  int wait() const { return wait_; }
  int cooldown_counter() const { return cooldown_counter_; }
  double best() const { return best_; }

 private:
  void reset();
  bool improved(double current) const;

  ReduceLROnPlateauOptions options_;
  bool maximize_ = false;
  double best_ = 0.0;
  int wait_ = 0;
  int cooldown_counter_ = 0;
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
