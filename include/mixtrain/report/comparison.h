// Comparison report: one model trained under several dtype policies on identical data and seed, each run
// judged against float32's own run-to-run noise. The report layer takes plain numbers, so the same data
// renders as a terminal table, JSON, a per-step CSV and one self-contained HTML page.
//
// The float32 band: K float32 runs that differ only in their seed (initial weights and data order; the
// first seed is the one every other policy uses) give, per step and per epoch, the lowest and highest loss,
// and at the end the lowest and highest final loss, test loss and test accuracy (make_float32_band). A run
// is judged against that band, widened by a tolerance: tolerance = max(margin x the band's width, floor),
// where the floor is the fixed threshold of the same criterion applied to the first float32 run (so a
// tiny band, or K = 1, falls back to the fixed thresholds rather than flagging noise).
//
// Verdicts (judge_run), checked in this order:
//   "baseline"    the first float32 run itself (policy == baseline.policy).
//   "diverged"    a training or validation loss (per step or per epoch) is NaN or infinite; or the final
//                 training loss is above the band by more than max(kDivergedBandMargin widths,
//                 (kDivergedFinalLossRatio - 1) x the baseline's); or at some step the smoothed per-step
//                 loss is above the band by more than max(kDivergedBandMargin widths, kDivergedCurveDeviation
//                 x the baseline's) (compared step by step only when both ran the same batch size).
//   "deviates"    an epoch's training loss is outside the band (either side) by more than max(kBandMargin
//                 widths, kDeviatesLossDeviation x the baseline's); or the validation loss is, in the same way,
//                 at the last epoch or at more than half of the epochs (one point in time, it spikes in noisy
//                 training where the epoch's mean training loss does not); or the test accuracy is
//                 below the band by more than max(kBandMargin widths, kDeviatesAccuracyDrop points); or the
//                 test loss is above it by more than max(kBandMargin widths, kDeviatesLossDeviation x the
//                 baseline's).
//   "no speedup"  it tracks, but speedup (steps/s relative to the baseline) is below kMinSpeedup (1.0).
//   "tracks"      otherwise.
// A run whose recovery rolled back (compare --recover) is judged from the step training resumed at after
// its last rollback: divergence on the steps from there, deviation on where it ended (last epoch, final
// loss, test loss and accuracy), since a recovered run lags the band by the steps it lost.
// A threshold is crossed only when exceeded by more than kThresholdSlack, so values that sit on a
// threshold up to floating-point rounding (0.89 vs 0.90 accuracy is a 1-point drop) do not cross it.
// A criterion whose inputs are missing (NaN, empty) is not applied.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/core/json.h"

namespace mixtrain {

// Fixed thresholds against the first float32 run: the floors of the band's tolerances.
inline constexpr double kDivergedFinalLossRatio = 2.0;
inline constexpr double kDivergedCurveDeviation = 0.50;
inline constexpr double kDeviatesLossDeviation = 0.05;
inline constexpr double kDeviatesAccuracyDrop = 1.0;  // percentage points
inline constexpr double kMinSpeedup = 1.0;
inline constexpr double kThresholdSlack = 1e-9;
// Band tolerances in band widths. With 3 seeds, a value drawn like a 4th float32 seed falls more than one
// width outside the seeds' range about 13% of the time; a mixed run shares the first seed's initial weights
// and data order, so it sits far closer than an independent seed would.
inline constexpr double kBandMargin = 1.0;
inline constexpr double kDivergedBandMargin = 4.0;
// float32 runs compare uses by default: 2 seeds give a spread from a single difference, below a third of
// the seed-to-seed standard deviation one time in five; with 3 seeds one time in 33, for one more run.
inline constexpr int kDefaultBaselineSeeds = 3;
// Weight of the previous value in the per-step loss smoothing (see smooth_loss).
inline constexpr double kLossSmoothing = 0.9;

inline constexpr double kNotMeasured = std::numeric_limits<double>::quiet_NaN();

// One action of the recovery ladder, as the report draws it.
struct RecoveryMark {
  int64_t step = 0;                 // global step (1-based) at which it was taken
  std::string action;               // "layers_to_float32", "model_to_float32", "enable_loss_scaling", "rollback", ...
  std::string reason;
  std::vector<std::string> layers;  // layers switched to float32
  int64_t resume_step = -1;         // rollback: steps kept; training resumed with step resume_step + 1
};

// How one run compares with the band on one criterion.
struct BandCheck {
  std::string quantity;             // "training loss", "validation loss", "smoothed training loss", "final training
                                    // loss", "test loss", "test accuracy", "non-finite loss"
  std::string kind;                 // what crossing it means: "diverged" or "deviates"
  int64_t index = 0;                // 1-based epoch or step for curves, 0 for end values
  double value = kNotMeasured;      // the run's value
  double lo = kNotMeasured, hi = kNotMeasured;  // the band there
  double tolerance = kNotMeasured;  // how far outside the band the value may lie
  double excess = 0;                // distance outside the band / tolerance (0 inside; > 1 crosses)
  bool crossed = false;
  // Curves judged by majority (the validation loss): points beyond the tolerance, of points judged.
  int64_t points_outside = 0, points_judged = 0;
};

// One policy's results. NaN means "not measured".
struct PolicyRun {
  std::string policy;                   // "float32", "mixed_float16", ...
  uint64_t seed = 0;
  int64_t batch_size = 0;               // rows per step (0: unknown)
  std::vector<double> step_loss;        // training loss per step (NaN allowed)
  std::vector<double> step_loss_scale;  // loss scale per step (empty when not scaled)
  std::vector<double> epoch_loss, epoch_val_loss;  // per epoch (per evaluation interval of a run by steps)
  double test_loss = kNotMeasured;      // test split (a language model: the validation text)
  double test_accuracy = kNotMeasured;  // fraction in [0, 1] (a language model: per character)
  double steps_per_second = kNotMeasured;
  double peak_memory_bytes = kNotMeasured;
  // compare --memory-plan: the plan's parts in bytes, bottom up ("weights", "gradients", ...; empty: no plan), and
  // the run's whole measured peak (the model's bytes and fit's peak above them) to set beside their sum.
  std::vector<std::pair<std::string, double>> memory_plan;
  double measured_memory_bytes = kNotMeasured;
  int64_t skipped_steps = 0;  // optimizer steps skipped by the loss scaler (non-finite gradients)
  std::vector<RecoveryMark> recovery;
  std::vector<std::pair<std::string, std::string>> layer_dtypes;  // each layer's compute dtype at the end
  // Set by fill_comparison:
  std::string verdict;         // "tracks", "deviates", "diverged", "no speedup", "baseline"
  std::string numerics_verdict;  // the verdict on the numbers alone: "no speedup" is "tracks" here
  std::string verdict_reason;  // one sentence: the deciding check (for "tracks", the closest one)
  std::vector<BandCheck> checks;     // the worst check of each criterion applied
  int64_t judged_from_step = 0;      // > 0 after a recovery rollback: the steps before are not judged
  // The numerics verdict the fixed thresholds alone (against the first float32 run) would give; empty when no band.
  std::string fixed_threshold_verdict;
  // Relative to the baseline:
  double accuracy_delta = kNotMeasured;      // test accuracy, percentage points
  double speedup = kNotMeasured;             // steps/s ratio
  double memory_ratio = kNotMeasured;        // peak memory ratio
  double max_loss_deviation = kNotMeasured;  // fraction (0.05 = 5%)
};

// Per index (step or epoch): the lowest and highest value over the float32 seeds that have a finite value
// there (NaN where none has), and the first seed's value.
struct SeriesBand {
  std::vector<double> lo, hi, ref;
};
struct ValueBand {
  double lo = kNotMeasured, hi = kNotMeasured, ref = kNotMeasured;
};

struct Float32Band {
  std::vector<uint64_t> seeds;  // of the float32 runs, the first shared with the other policies; empty: no band
  SeriesBand step_loss;         // smoothed per-step training loss (smooth_loss of each run)
  SeriesBand epoch_loss, epoch_val_loss;
  ValueBand final_loss, test_loss, test_accuracy;
};

struct ComparisonReport {
  std::string title;
  std::string model, data;
  uint64_t seed = 0;
  int epochs = 0;
  std::vector<PolicyRun> runs;  // the baseline (float32) first, by convention
  Float32Band band;             // float32's seed band (seeds.size() == 1: the baseline alone)
  std::vector<PolicyRun> extra_seeds;  // the float32 runs of the other seeds, drawn faintly
  bool batch_size_auto = false;        // --batch-size auto: each run's batch_size is the largest that fits
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

// The band of several curves (the first is the reference), index by index over the longest.
SeriesBand series_band(const std::vector<std::vector<double>>& curves);
// How far outside [lo, hi] a value may lie: max(margin * (hi - lo), floor). NaN when an input is missing.
double band_tolerance(double lo, double hi, double margin, double floor);
// Per index, the highest loss that is not yet "deviates": hi + band_tolerance(lo, hi, kBandMargin,
// kDeviatesLossDeviation * |ref|). compare --recover hands this (on the recovery guard's smoothing) to the guard.
std::vector<double> deviation_ceiling(const SeriesBand& band);

// The band of float32 runs that differ only in seed; runs[0] is the baseline the other policies share a
// seed with. Requires at least one run.
Float32Band make_float32_band(const std::vector<PolicyRun>& float32_runs);

struct Verdict {
  std::string verdict, reason;
  std::string numerics;  // the verdict without the speed criterion
  std::string detail;    // the reason without what the recovery did
  std::vector<BandCheck> checks;
  int64_t judged_from_step = 0;
};
// The verdict of run against the band (baseline: the first float32 run, for speed and the floors).
Verdict judge_run(const PolicyRun& run, const Float32Band& band, const PolicyRun& baseline);
// The verdict against the baseline alone (a band of one run: the fixed thresholds).
std::string verdict_for(const PolicyRun& run, const PolicyRun& baseline);

// Sets run's accuracy_delta, speedup, memory_ratio, max_loss_deviation and the verdict fields from the
// baseline and the band (the baseline itself gets 0, 1, 1, 0 and "baseline"). Ratios with a zero or
// missing baseline are NaN. Without a band (or an empty one) the baseline alone is the band.
void fill_comparison(PolicyRun& run, const PolicyRun& baseline, const Float32Band& band = {});

// Fixed-width text table, one row per run: policy, final loss, test acc, Δacc (points), loss dev %,
// steps/s, speedup, peak MiB, mem ratio, skipped, verdict. Each line ends in '\n'.
std::string format_comparison_table(const ComparisonReport& report);

// The whole report as JSON: settings, thresholds, the band, and per policy every field of PolicyRun plus
// its final loss. Non-finite numbers become null; a seed above 2^53 is written as a decimal string.
Json comparison_to_json(const ComparisonReport& report);

// Writes one CSV row per run and step: step (from 1), policy, loss, loss_scale (empty when the run
// has no loss scale for that step). Throws mixtrain::Error (kIo) when the file cannot be written.
void write_steps_csv(const std::string& path, const ComparisonReport& report);

// One self-contained HTML page (inline CSS and SVG; no scripts, fonts or other external resources):
// title, settings, the comparison table, each verdict's reason, the smoothed per-step loss curves of all
// policies overlaid on float32's shaded seed band with the recovery actions marked, the validation loss per
// epoch on its band, the loss scale (log axis) when any run has one, bar charts of steps/s, peak memory and
// (with --batch-size auto) the largest batch that fits, each layer's final compute dtype, how verdicts are
// decided, and the notes.
std::string render_comparison_html(const ComparisonReport& report);

}  // namespace mixtrain
