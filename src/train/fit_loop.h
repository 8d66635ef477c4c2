// fit()'s loop: epochs of steps queued in windows whose logs are read at once, the callbacks, the guard, the
// History, and the position a checkpoint saves and a resume starts from. Model::FitLoop is nested in Model
// (model.h) so it reaches the training step's internals; one lives for each fit() call.
//   fit_loop.cpp    the loop: options, data, epochs
//   fit_window.cpp  a window of queued steps: their device records read at once, the History, the guard
//   fit_resume.cpp  the position out (fit_state()) and back in (FitOptions::resume)
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/train/model.h"
#include "mixtrain/train/progress_bar_logger.h"

namespace mixtrain {

namespace detail {
// The key of each callback that keeps state: its kind and its rank among the callbacks of that kind
// ("EarlyStopping.0"), so two of a kind keep their own states. Empty for the callbacks that keep none.
std::vector<std::string> callback_state_keys(const std::vector<Callback*>& callbacks);
}  // namespace detail

class Model::FitLoop {
 public:
  // Checks the options (Error on a bad one), splits off the validation rows, builds the model, starts data
  // parallelism and takes up options.resume; nothing is trained yet.
  FitLoop(Model& model, const Tensor& x_all, const Tensor& y_all, const FitOptions& options);
  FitLoop(const FitLoop&) = delete;
  FitLoop& operator=(const FitLoop&) = delete;
  // The epochs, from the callbacks' on_train_begin to their on_train_end.
  History run();
  // Where the loop stands after the last completed step or epoch (Model::fit_state()).
  FitState state() const;

 private:
  using Clock = std::chrono::steady_clock;
  static double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  }
  // The steps of one window, queued: their logs' records are read together.
  struct Window {
    std::vector<QueuedStep> queued;
    std::vector<int64_t> batch_rows;  // each step's rows of the global batch
    std::vector<int64_t> idx;         // the last batch's rows (the recovery guard's window is one step)
    Tensor yb;                        // the last batch's labels
  };

  // fit_loop.cpp
  void take_data(const Tensor& x_all, const Tensor& y_all);
  // Draws an epoch's row order from `rng` (the shuffle stream, or a copy of it set to a saved state).
  std::vector<int64_t> draw_order(Rng& rng) const;
  // Steps queued between two reads of their logs (FitOptions::steps_per_log).
  int64_t window_size() const;
  void begin_epoch();
  void snapshot_if_due();
  // Ends the fit after the step just completed, on a StopRequest: the callbacks' on_train_interrupted.
  History interrupt();
  void end_epoch();
  Logs running_means() const;

  // fit_window.cpp
  Window queue_window(int64_t count);
  // Reads the window's records into the History and the running sums; false when the guard rolled back.
  bool record_window(const Window& window, Clock::time_point window_start);
  void add_to_sums(const Logs& step_logs, int64_t rows);
  void roll_back();

  // fit_resume.cpp
  void resume(const FitState& s);
  void check_resumable(const FitState& s) const;
  void resume_mid_epoch(const FitState& s);
  void restore_callback_states(const FitState& s);

  Model& model_;
  const FitOptions& options_;
  Tensor x_, y_, val_x_, val_y_;  // training rows, validation rows (undefined without)
  Communicator* comm_ = nullptr;  // data-parallel over more than one rank, else null
  int64_t rows_ = 0, steps_ = 0;  // training rows, steps per epoch
  bool sampled_ = false;          // batches drawn with replacement (steps_per_epoch)
  std::vector<Callback*> callbacks_;
  std::unique_ptr<ProgressBarLogger> progress_;
  RecoveryGuard* guard_ = nullptr;
  History history_;
  FitPosition pos_;  // epoch, step within it, row order and running sums
  bool resumed_mid_epoch_ = false;
  bool first_step_of_fit_ = true;
  bool epoch_recorded_ = false;  // pos_.epoch is in the History (on_epoch_end): the state is the next epoch's start
  int64_t window_ = 1;
  Tensor records_;  // (window_, kRecordSize) on the model's device
  Clock::time_point epoch_start_;
  Logs epoch_logs_;
};

}  // namespace mixtrain
