// History: what fit() returns, as keras.callbacks.History: per-epoch values by metric name.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mixtrain {

// Named values in a stable order ("loss", "accuracy", "val_loss", ...), as Keras' logs dict.
using Logs = std::vector<std::pair<std::string, double>>;
// The value of key in logs, or fallback.
double log_value(const Logs& logs, const std::string& key, double fallback = 0.0);
bool has_log(const Logs& logs, const std::string& key);

struct History {
  std::vector<int> epoch;                               // 0-based epoch indices that completed
  std::map<std::string, std::vector<double>> history;   // "loss" -> one value per epoch, ...
  std::vector<double> step_loss;                        // training loss of every step, in order
  std::vector<double> epoch_seconds;                    // wall time of each epoch
  std::vector<double> step_loss_scale;                  // loss scale used at each step (mixed_float16)
  int64_t steps = 0;                                    // training steps run
  int64_t samples = 0;                                  // training rows processed
  double train_seconds = 0;                             // wall time of the training steps only
  // fit() ended on a StopRequest (train/stop_request.h) before its last step. Not saved in checkpoints.
  bool interrupted = false;
};

}  // namespace mixtrain
