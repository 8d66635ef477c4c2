// Callback, as keras.callbacks.Callback: the hooks fit() calls at the start and end of training, epochs and steps.
// The interface sits below Model: fit() calls it, and the callbacks that act on the model (train/callbacks.h) build
// on both.
#pragma once

#include <cstdint>
#include <string>

#include "mixtrain/train/fit_state.h"
#include "mixtrain/train/history.h"

namespace mixtrain {

class Model;

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
  // Instead of on_epoch_begin when fit() resumes (FitOptions::resume) inside an epoch, `steps_done` steps into
  // it. By default the same as on_epoch_begin; a callback whose epoch-begin action is already in the restored
  // state (LearningRateScheduler's rate is in the optimizer's) overrides it so the action is not applied twice.
  virtual void on_epoch_resume(int epoch, int64_t steps_done) {
    (void)steps_done;
    on_epoch_begin(epoch);
  }
  // step is 1-based within the epoch; logs hold the running means of the epoch so far.
  virtual void on_train_batch_end(int64_t step, const Logs& logs) {
    (void)step;
    (void)logs;
  }
  // At the end of each epoch, before History records the logs and before any on_epoch_end: a callback adds
  // its own entries here (LearningRateScheduler and ReduceLROnPlateau: "learning_rate"). Keras callbacks write
  // into the logs dict in on_epoch_end; a separate step lets History and every on_epoch_end, whatever the
  // callback order, see the same logs.
  virtual void on_epoch_logs(int epoch, Logs& logs) {
    (void)epoch;
    (void)logs;
  }
  virtual void on_epoch_end(int epoch, const Logs& logs) {
    (void)epoch;
    (void)logs;
  }
  virtual void on_train_end(const Logs& logs) { (void)logs; }
  // Instead of on_train_end when fit() stops on a StopRequest (train/stop_request.h) after step `steps_done`
  // (1-based) of `epoch`, with the rest of the epoch and of training left: the point to save what a resumed fit
  // needs (CheckpointCallback does). The model is as that step left it; Model::fit_state() is that position.
  virtual void on_train_interrupted(int epoch, int64_t steps_done) {
    (void)epoch;
    (void)steps_done;
  }

  // A checkpoint saved during fit() keeps the state of every callback with a state key, and a fit() resumed from
  // it hands that state back right after on_train_begin (which resets it), so counting goes on where it stood.
  // Keras' BackupAndRestore keeps none, so a resumed EarlyStopping waits its whole patience again; here nothing
  // is lost. The key names the kind ("EarlyStopping"); an empty key keeps nothing.
  virtual std::string state_key() const { return ""; }
  virtual CallbackState state() const { return {}; }
  // Throws Error when the state is malformed (a damaged checkpoint).
  virtual void restore_state(const CallbackState& state) { (void)state; }

 protected:
  Model* model_ = nullptr;
};

}  // namespace mixtrain
