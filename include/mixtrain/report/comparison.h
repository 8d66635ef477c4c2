// Comparison report: one model trained under several dtype policies on identical data and seed,
// each run judged against the float32 run. The report layer takes plain numbers, so the same data
// renders as a terminal table, JSON, a per-step CSV and one self-contained HTML page.
//
// Verdicts (verdict_for), checked in this order:
//   "baseline"    the float32 run itself (policy == baseline.policy).
//   "diverged"    any training or validation loss (per step or per epoch) is NaN or infinite; or the
//                 final loss is more than kDivergedFinalLossRatio (2x) the baseline's; or the smoothed
//                 per-step loss curve deviates from the baseline's by more than kDivergedCurveDeviation
//                 (50%, relative, at any step they share).
//   "deviates"    max_loss_deviation (per-epoch training loss, relative to the baseline's) is above
//                 kDeviatesLossDeviation (5%); or test accuracy is more than kDeviatesAccuracyDrop
//                 (1 percentage point) below the baseline's.
//   "no speedup"  it tracks, but speedup (steps/s relative to the baseline) is below kMinSpeedup (1.0).
//   "tracks"      otherwise.
// A threshold is crossed only when exceeded by more than kThresholdSlack, so values that sit on a
// threshold up to floating-point rounding (0.89 vs 0.90 accuracy is a 1-point drop) do not cross it.
// A criterion whose inputs are missing (NaN, empty) is not applied.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "mixtrain/core/json.h"

namespace mixtrain {

inline constexpr double kDivergedFinalLossRatio = 2.0;
inline constexpr double kDivergedCurveDeviation = 0.50;
inline constexpr double kDeviatesLossDeviation = 0.05;
inline constexpr double kDeviatesAccuracyDrop = 1.0;  // percentage points
inline constexpr double kMinSpeedup = 1.0;
inline constexpr double kThresholdSlack = 1e-9;
// Weight of the previous value in the per-step loss smoothing (see smooth_loss).
inline constexpr double kLossSmoothing = 0.9;

// One policy's results. NaN means "not measured".
struct PolicyRun {
  std::string policy;                   // "float32", "mixed_float16", ...
  std::vector<double> step_loss;        // training loss per step (NaN allowed)
  std::vector<double> step_loss_scale;  // loss scale per step (empty when not scaled)
  std::vector<double> epoch_loss, epoch_val_loss;
  double test_loss = std::numeric_limits<double>::quiet_NaN();
  double test_accuracy = std::numeric_limits<double>::quiet_NaN();  // fraction in [0, 1]
  double steps_per_second = std::numeric_limits<double>::quiet_NaN();
  double peak_memory_bytes = std::numeric_limits<double>::quiet_NaN();
  int64_t skipped_steps = 0;  // optimizer steps skipped by the loss scaler (non-finite gradients)
  std::string verdict;        // "tracks", "deviates", "diverged", "no speedup", "baseline"
  // Relative to the baseline (set by fill_comparison):
  double accuracy_delta = std::numeric_limits<double>::quiet_NaN();      // test accuracy, percentage points
  double speedup = std::numeric_limits<double>::quiet_NaN();             // steps/s ratio
  double memory_ratio = std::numeric_limits<double>::quiet_NaN();        // peak memory ratio
  double max_loss_deviation = std::numeric_limits<double>::quiet_NaN();  // fraction (0.05 = 5%)
};

struct ComparisonReport {
  std::string title;
  std::string model, data;
  uint64_t seed = 0;
  int epochs = 0;
  std::vector<PolicyRun> runs;  // the baseline (float32) first, by convention
  std::vector<std::string> notes;
};

// The loss the run ended with: the last per-epoch training loss, else the last per-step loss, else NaN.
double final_loss(const PolicyRun& run);

// Exponential moving average of a per-step loss, bias-corrected as TensorBoard does so the curve
// starts at the first loss rather than at zero: s_t = kLossSmoothing * s_{t-1} + (1 - kLossSmoothing) * x_t,
// reported as s_t / (1 - kLossSmoothing^t). A non-finite value is passed through (a gap in a chart)
// and leaves the average unchanged.
std::vector<double> smooth_loss(const std::vector<double>& loss, double weight = kLossSmoothing);

// max |values[i] - reference[i]| / |reference[i]| over the indices both have. An index where the
// reference is non-finite is skipped; one where only the value is non-finite counts as infinite.
// A zero reference counts as infinite unless the value is zero too. NaN when nothing is compared.
double max_relative_deviation(const std::vector<double>& values, const std::vector<double>& reference);

// The verdict of run against the float32 baseline, by the thresholds above.
std::string verdict_for(const PolicyRun& run, const PolicyRun& baseline);

// Sets run's accuracy_delta, speedup, memory_ratio, max_loss_deviation and verdict from the baseline
// (the baseline itself gets 0, 1, 1, 0 and "baseline"). Ratios with a zero or missing baseline are NaN.
void fill_comparison(PolicyRun& run, const PolicyRun& baseline);

// Fixed-width text table, one row per run: policy, final loss, test acc, Δacc (points), loss dev %,
// steps/s, speedup, peak MiB, mem ratio, skipped, verdict. Each line ends in '\n'.
std::string format_comparison_table(const ComparisonReport& report);

// The whole report as JSON: settings, thresholds, and per policy every field of PolicyRun plus its
// final loss. Non-finite numbers become null; a seed above 2^53 is written as a decimal string.
Json comparison_to_json(const ComparisonReport& report);

// Writes one CSV row per run and step: step (from 1), policy, loss, loss_scale (empty when the run
// has no loss scale for that step). Throws mixtrain::Error (kIo) when the file cannot be written.
void write_steps_csv(const std::string& path, const ComparisonReport& report);

// One self-contained HTML page (inline CSS and SVG; no scripts, fonts or other external resources):
// title, settings, the comparison table, how verdicts are decided, the smoothed per-step loss curves
// of all policies overlaid, the loss scale (log axis) when any run has one, and the notes.
std::string render_comparison_html(const ComparisonReport& report);

}  // namespace mixtrain
