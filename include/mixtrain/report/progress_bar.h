// ProgressBar: the Keras-style per-epoch progress line.
//   interactive:     " 37/469 [==>...........................] - ETA: 12s - loss: 0.5123 - accuracy: 0.8120"
//   (the step count is right-aligned to the width of the total so the bar does not jump)
//   non-interactive: "469/469 - 4s - 9ms/step - loss: 0.5123 - accuracy: 0.8120" (once, at finish)
// Redrawing with '\r' only makes sense on a terminal; in logs and pipes it would leave hundreds of
// partial lines, so non-interactive mode prints just the summary.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

namespace mixtrain {

// Named scalar values shown after the bar, in order: {{"loss", 0.51}, {"accuracy", 0.81}}.
using MetricValues = std::vector<std::pair<std::string, double>>;

// True when standard output is a terminal (isatty), i.e. a progress bar may redraw in place.
bool stdout_is_terminal();

// Formats a metric value: 4 decimals ("0.5123"), or "%.4g" when |value| >= 1e4 or 0 < |value| < 1e-3
// ("1.235e+04", "0.0001234", "1e-05") so large and tiny values keep their significant digits.
std::string format_metric_value(double value);

// Formats a duration in whole seconds as Keras does: "12s", "1:05", "1:01:05".
std::string format_eta(double seconds);

class ProgressBar {
 public:
  // total_steps <= 0 means unknown: the bar shows "37/Unknown" and the elapsed time instead of an ETA.
  ProgressBar(int64_t total_steps, std::ostream& out, bool interactive);

  // Reports that step (1-based) is done. Interactive: redraws the line, at most ~10 times per second,
  // always for the last step. Non-interactive: records the step and prints nothing.
  void update(int64_t step, const MetricValues& values);

  // Ends the bar with its summary and a newline. seconds is the epoch's wall time; the per-step time
  // is seconds divided by the last step reported (total_steps when no step was reported).
  void finish(const MetricValues& values, double seconds);

  // Width of the bar between the brackets, in characters.
  static constexpr int kBarWidth = 30;
  // Minimum time between two interactive redraws.
  static constexpr double kRedrawIntervalSeconds = 0.1;

 private:
  std::string counter(int64_t step) const;  // " 37/469" (padded when interactive) or "37/Unknown"
  std::string bar(int64_t step) const;      // "[====>.....]"
  // Writes line over the previous frame, padding with spaces when the new frame is shorter.
  void draw(const std::string& line);

  int64_t total_;
  std::ostream& out_;
  bool interactive_;
  int64_t last_step_ = 0;
  size_t last_width_ = 0;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace mixtrain
