// float32's seed band and the verdicts judged against it (see report/comparison.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>

#include "mixtrain/core/error.h"
#include "mixtrain/report/comparison.h"

namespace mixtrain {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::string format(const char* f, double v) {
  char buf[64];
  const int n = std::snprintf(buf, sizeof buf, f, v);
  return std::string(buf, static_cast<size_t>(n > 0 ? n : 0));
}

double ratio(double value, double reference) {
  if (!std::isfinite(value) || !std::isfinite(reference) || reference == 0) return kNaN;
  return value / reference;
}

// Which side of the band a criterion watches.
enum class Side { kAbove, kBelow, kBoth };

// The check of value against [lo, hi] widened by tolerance; nullopt when an input is missing.
std::optional<BandCheck> check(const std::string& quantity, const std::string& kind, int64_t index, double value,
                               double lo, double hi, double tolerance, Side side) {
  if (!std::isfinite(value) || !std::isfinite(lo) || !std::isfinite(hi) || !std::isfinite(tolerance)) return {};
  double distance = 0;
  if (side != Side::kBelow && value > hi) distance = value - hi;
  if (side != Side::kAbove && value < lo) distance = lo - value;
  BandCheck c;
  c.quantity = quantity;
  c.kind = kind;
  c.index = index;
  c.value = value;
  c.lo = lo;
  c.hi = hi;
  c.tolerance = tolerance;
  c.excess = tolerance > 0 ? distance / tolerance : (distance > 0 ? kInf : 0);
  c.crossed = distance > tolerance + kThresholdSlack;
  return c;
}

// Keeps the check that comes closest to (or goes furthest past) its threshold.
void keep_worst(std::optional<BandCheck>& worst, const std::optional<BandCheck>& c) {
  if (c && (!worst || c->excess > worst->excess)) worst = c;
}

// The first non-finite value of a curve from index `from` on, as a crossed "diverged" check.
std::optional<BandCheck> first_non_finite(const std::vector<double>& values, size_t from, const std::string& quantity) {
  for (size_t i = from; i < values.size(); ++i) {
    if (std::isfinite(values[i])) continue;
    BandCheck c;
    c.quantity = quantity;
    c.kind = "diverged";
    c.index = static_cast<int64_t>(i + 1);
    c.value = values[i];
    c.excess = kInf;
    c.crossed = true;
    return c;
  }
  return {};
}

double at(const std::vector<double>& v, size_t i) { return i < v.size() ? v[i] : kNaN; }

bool is_accuracy(const BandCheck& c) { return c.quantity == "test accuracy"; }

std::string value_text(const BandCheck& c, double v) {
  return is_accuracy(c) ? format("%.2f%%", v * 100) : format("%.4g", v);
}
std::string amount_text(const BandCheck& c, double v) {
  return is_accuracy(c) ? format("%.2f points", v * 100) : format("%.3g", v);
}

std::string where(const BandCheck& c) {
  if (c.index <= 0) return "";
  const bool per_step = c.quantity == "smoothed training loss" || c.quantity == "training loss (per step)";
  return (per_step ? "at step " : "in epoch ") + std::to_string(c.index) + ", ";
}

std::string band_text(const BandCheck& c, size_t seeds) {
  if (seeds <= 1) return "the float32 run's " + value_text(c, c.lo);
  return "float32's band " + value_text(c, c.lo) + "–" + value_text(c, c.hi) + " over " + std::to_string(seeds) +
         " seeds";
}

// One clause saying where a check stands: "in epoch 3, the training loss 0.52 is above float32's band
// 0.44–0.47 over 3 seeds by 0.05, more than the 0.023 allowed".
std::string describe(const BandCheck& c, size_t seeds) {
  if (!std::isfinite(c.value))
    return where(c) + "the " + c.quantity + " became " + (std::isnan(c.value) ? "NaN" : "infinite");
  const double distance = c.value > c.hi ? c.value - c.hi : c.value < c.lo ? c.lo - c.value : 0;
  std::string s = where(c) + "the " + c.quantity + " " + value_text(c, c.value);
  if (distance == 0) return s + " lies inside " + band_text(c, seeds);
  s += std::string(" is ") + (c.value > c.hi ? "above " : "below ") + band_text(c, seeds) + " by " +
       amount_text(c, distance);
  if (!c.crossed && distance > c.tolerance + kThresholdSlack)
    return s + ", more than the " + amount_text(c, c.tolerance) + " allowed, but at only " +
           std::to_string(c.points_outside) + " of " + std::to_string(c.points_judged) +
           " epochs and not the last: a spike, not a deviation";
  if (!c.crossed) return s + ", within the " + amount_text(c, c.tolerance) + " allowed";
  return s + (c.kind == "diverged" ? ", beyond the " + amount_text(c, c.tolerance) + " that counts as diverging"
                                   : ", more than the " + amount_text(c, c.tolerance) + " allowed");
}

std::string capitalised(std::string s) {
  if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = static_cast<char>(s[0] - 'a' + 'A');
  return s;
}
std::string lowercased_start(std::string s) {
  if (!s.empty() && s[0] >= 'A' && s[0] <= 'Z') s[0] = static_cast<char>(s[0] - 'A' + 'a');
  return s;
}

// Where the judgement starts: the step training resumed at after the run's last rollback (0 without one).
int64_t resume_step(const PolicyRun& run) {
  int64_t from = 0;
  for (const RecoveryMark& m : run.recovery)
    if (m.action == "rollback" && m.resume_step >= 0) from = std::max(from, m.resume_step);
  return from;
}

// "its recovery moved reshape, conv2d to float32 at step 138, rolling back to step 0"; empty without actions.
std::string recovery_clause(const PolicyRun& run) {
  std::string actions;
  int64_t back_to = -1;
  for (const RecoveryMark& m : run.recovery) {
    std::string a;
    if (m.action == "layers_to_float32" || m.action == "layers_to_bfloat16") {
      for (size_t i = 0; i < m.layers.size(); ++i) a += (i ? ", " : "") + m.layers[i];
      a = "moved " + a + (m.action == "layers_to_bfloat16" ? " to mixed_bfloat16" : " to float32");
    } else if (m.action == "model_to_float32") {
      a = "moved the whole model to float32";
    } else if (m.action == "enable_loss_scaling") {
      a = "switched loss scaling on";
    } else if (m.action == "rollback") {
      back_to = m.resume_step;
      continue;
    } else {
      continue;
    }
    actions += (actions.empty() ? "" : ", then ") + a + " at step " + std::to_string(m.step);
  }
  if (actions.empty()) return "";
  return "its recovery " + actions + (back_to >= 0 ? ", rolling back to step " + std::to_string(back_to) : "");
}

// The first float32 run's own verdict: with the other seeds' runs it spans the band.
Verdict baseline_verdict(const Float32Band& band, const PolicyRun& baseline) {
  const size_t seeds = band.seeds.size();
  Verdict v;
  v.verdict = v.numerics = "baseline";
  v.reason = "The float32 run with seed " + std::to_string(baseline.seed) + ", which every other policy shares";
  if (seeds > 1) {
    v.reason += seeds > 2 ? "; with the float32 runs of seeds" : "; with the float32 run of seed";
    for (size_t i = 1; i < seeds; ++i) v.reason += (i > 1 ? ", " : " ") + std::to_string(band.seeds[i]);
    v.reason += " it spans the band the other policies are judged against";
  }
  v.reason += ".";
  return v;
}

// Which part of a run is judged: after a rollback to a later step the run lags the band by the steps it lost, so
// it is judged from the step it resumed at (divergence) and by where it ended (deviation).
struct JudgedSpan {
  int64_t from_step = 0;   // the first judged step, 0-based (0: all)
  size_t from_epoch = 0;   // the epoch that step falls in
  bool recovered = false;  // from_step > 0
};

JudgedSpan judged_span(const PolicyRun& run) {
  JudgedSpan span;
  span.from_step = resume_step(run);
  span.recovered = span.from_step > 0;
  const size_t epochs = run.epoch_loss.size();
  const size_t steps_per_epoch = epochs ? (run.step_loss.size() + epochs - 1) / epochs : 0;
  span.from_epoch = steps_per_epoch ? static_cast<size_t>(span.from_step) / steps_per_epoch : 0;
  return span;
}

// A criterion whose inputs are missing gives no check, and is left out.
void add_applied(std::vector<BandCheck>& checks, const std::optional<BandCheck>& c) {
  if (c) checks.push_back(*c);
}

// Diverged: non-finite losses, a final loss or a smoothed curve far above the band.
void add_divergence_checks(std::vector<BandCheck>& checks, const PolicyRun& run, const Float32Band& band,
                           const PolicyRun& baseline, const JudgedSpan& span) {
  const size_t from_step = static_cast<size_t>(span.from_step);
  std::optional<BandCheck> non_finite = first_non_finite(run.step_loss, from_step, "training loss (per step)");
  if (!non_finite) non_finite = first_non_finite(run.epoch_loss, span.from_epoch, "training loss");
  if (!non_finite) non_finite = first_non_finite(run.epoch_val_loss, span.from_epoch, "validation loss");
  add_applied(checks, non_finite);
  const ValueBand& fb = band.final_loss;
  add_applied(checks, check("final training loss", "diverged", 0, final_loss(run), fb.lo, fb.hi,
                            band_tolerance(fb.lo, fb.hi, kDivergedBandMargin,
                                           (kDivergedFinalLossRatio - 1) * std::fabs(fb.ref)),
                            Side::kAbove));
  // Step by step only when both ran the same steps (the same batch size).
  const bool same_steps = run.batch_size == 0 || baseline.batch_size == 0 || run.batch_size == baseline.batch_size;
  if (!same_steps) return;
  std::optional<BandCheck> curve_check;
  const std::vector<double> smoothed = smooth_loss(run.step_loss);
  const SeriesBand& b = band.step_loss;
  for (size_t t = from_step; t < smoothed.size() && t < b.hi.size(); ++t)
    keep_worst(curve_check,
               check("smoothed training loss", "diverged", static_cast<int64_t>(t + 1), smoothed[t], b.lo[t], b.hi[t],
                     band_tolerance(b.lo[t], b.hi[t], kDivergedBandMargin,
                                    kDivergedCurveDeviation * std::fabs(b.ref[t])),
                     Side::kAbove));
  add_applied(checks, curve_check);
}

// The worst epoch of a per-epoch curve against the band; a recovered run only at its last epoch. majority: the
// curve counts as outside only at the last epoch or at more than half of the epochs judged.
std::optional<BandCheck> epoch_check(const std::vector<double>& values, const SeriesBand& b,
                                     const std::string& quantity, bool majority, bool recovered) {
  std::optional<BandCheck> worst, last;
  size_t judged = 0, outside = 0;
  const size_t first = recovered && !values.empty() ? values.size() - 1 : 0;
  for (size_t e = first; e < values.size() && e < b.hi.size(); ++e) {
    const std::optional<BandCheck> c =
        check(quantity, "deviates", static_cast<int64_t>(e + 1), values[e], b.lo[e], b.hi[e],
              band_tolerance(b.lo[e], b.hi[e], kBandMargin, kDeviatesLossDeviation * std::fabs(b.ref[e])), Side::kBoth);
    if (!c) continue;
    ++judged;
    outside += c->crossed;
    keep_worst(worst, c);
    if (e + 1 == values.size()) last = c;
  }
  if (majority && worst) {
    worst->points_outside = static_cast<int64_t>(outside);
    worst->points_judged = static_cast<int64_t>(judged);
    // Crossed only at a minority of epochs, not at the last: a spike, not a deviation.
    if (worst->crossed && 2 * outside <= judged && !(last && last->crossed)) worst->crossed = false;
  }
  return worst;
}

// Deviates: an epoch's training or validation loss, the test accuracy or the test loss outside the band.
// The training loss is a mean over the epoch's steps: any epoch counts. The validation loss is measured at one
// point in time and spikes in noisy training: it counts at the last epoch, or when outside at most epochs.
void add_deviation_checks(std::vector<BandCheck>& checks, const PolicyRun& run, const Float32Band& band,
                          bool recovered) {
  add_applied(checks, epoch_check(run.epoch_loss, band.epoch_loss, "training loss", false, recovered));
  add_applied(checks, epoch_check(run.epoch_val_loss, band.epoch_val_loss, "validation loss", true, recovered));
  const ValueBand& acc = band.test_accuracy;
  add_applied(checks, check("test accuracy", "deviates", 0, run.test_accuracy, acc.lo, acc.hi,
                            band_tolerance(acc.lo, acc.hi, kBandMargin, kDeviatesAccuracyDrop / 100), Side::kBelow));
  const ValueBand& tl = band.test_loss;
  add_applied(checks, check("test loss", "deviates", 0, run.test_loss, tl.lo, tl.hi,
                            band_tolerance(tl.lo, tl.hi, kBandMargin, kDeviatesLossDeviation * std::fabs(tl.ref)),
                            Side::kAbove));
}

// The worst crossed check of one kind.
std::optional<BandCheck> worst_crossed(const std::vector<BandCheck>& checks, const char* kind) {
  std::optional<BandCheck> w;
  for (const BandCheck& c : checks)
    if (c.crossed && c.kind == kind) keep_worst(w, c);
  return w;
}

// Sets v's verdict and numerics verdict from its checks and the run's speed, and returns the sentence saying why:
// the deciding check, the worst crossed one of the most severe kind; for a tracking run the closest call.
std::string decide(Verdict& v, const PolicyRun& run, const PolicyRun& baseline, size_t seeds) {
  std::optional<BandCheck> decisive = worst_crossed(v.checks, "diverged");
  v.verdict = decisive ? "diverged" : "";
  if (!decisive && (decisive = worst_crossed(v.checks, "deviates"))) v.verdict = "deviates";
  v.numerics = v.verdict;
  if (decisive) return describe(*decisive, seeds);
  std::optional<BandCheck> closest;
  for (const BandCheck& c : v.checks) keep_worst(closest, c);
  std::string sentence = seeds > 1 ? "every judged value lies within float32's seed band, give or take its tolerance"
                                   : "every judged value lies within the fixed thresholds of the float32 run";
  if (closest) sentence += "; the closest call: " + describe(*closest, seeds);
  v.numerics = "tracks";
  const double speedup = ratio(run.steps_per_second, baseline.steps_per_second);
  if (speedup < kMinSpeedup - kThresholdSlack) {
    v.verdict = "no speedup";
    return "it tracks float32 (" + sentence + "), but runs at " + format("%.2fx", speedup) +
           " float32's steps per second";
  }
  v.verdict = "tracks";
  return sentence;
}

}  // namespace

SeriesBand series_band(const std::vector<std::vector<double>>& curves) {
  SeriesBand band;
  size_t n = 0;
  for (const auto& c : curves) n = std::max(n, c.size());
  band.lo.assign(n, kNaN);
  band.hi.assign(n, kNaN);
  band.ref.assign(n, kNaN);
  for (size_t i = 0; i < n; ++i) {
    for (const auto& c : curves) {
      const double v = at(c, i);
      if (!std::isfinite(v)) continue;
      band.lo[i] = std::isnan(band.lo[i]) ? v : std::min(band.lo[i], v);
      band.hi[i] = std::isnan(band.hi[i]) ? v : std::max(band.hi[i], v);
    }
    if (!curves.empty()) band.ref[i] = at(curves.front(), i);
  }
  return band;
}

double band_tolerance(double lo, double hi, double margin, double floor) {
  if (!std::isfinite(lo) || !std::isfinite(hi) || !std::isfinite(floor)) return kNaN;
  return std::max(margin * (hi - lo), floor);
}

std::vector<double> deviation_ceiling(const SeriesBand& band) {
  std::vector<double> ceiling(band.hi.size(), kNaN);
  for (size_t i = 0; i < ceiling.size(); ++i)
    ceiling[i] = band.hi[i] + band_tolerance(band.lo[i], band.hi[i], kBandMargin,
                                             kDeviatesLossDeviation * std::fabs(at(band.ref, i)));
  return ceiling;
}

Float32Band make_float32_band(const std::vector<PolicyRun>& runs) {
  MIXTRAIN_CHECK(!runs.empty(), "make_float32_band: needs at least one float32 run");
  Float32Band band;
  std::vector<std::vector<double>> steps, epochs, val;
  std::vector<double> finals, test_losses, accuracies;
  for (const PolicyRun& r : runs) {
    band.seeds.push_back(r.seed);
    steps.push_back(smooth_loss(r.step_loss));
    epochs.push_back(r.epoch_loss);
    val.push_back(r.epoch_val_loss);
    finals.push_back(final_loss(r));
    test_losses.push_back(r.test_loss);
    accuracies.push_back(r.test_accuracy);
  }
  band.step_loss = series_band(steps);
  band.epoch_loss = series_band(epochs);
  band.epoch_val_loss = series_band(val);
  auto value_band = [](const std::vector<double>& v) {
    ValueBand b;
    b.ref = v.front();
    for (double x : v) {
      if (!std::isfinite(x)) continue;
      b.lo = std::isnan(b.lo) ? x : std::min(b.lo, x);
      b.hi = std::isnan(b.hi) ? x : std::max(b.hi, x);
    }
    return b;
  };
  band.final_loss = value_band(finals);
  band.test_loss = value_band(test_losses);
  band.test_accuracy = value_band(accuracies);
  return band;
}

Verdict judge_run(const PolicyRun& run, const Float32Band& band_in, const PolicyRun& baseline) {
  const Float32Band band = band_in.seeds.empty() ? make_float32_band({baseline}) : band_in;
  if (run.policy == baseline.policy) return baseline_verdict(band, baseline);
  const JudgedSpan span = judged_span(run);
  Verdict v;
  v.judged_from_step = span.from_step;
  add_divergence_checks(v.checks, run, band, baseline, span);
  add_deviation_checks(v.checks, run, band, span.recovered);
  std::string sentence = decide(v, run, baseline, band.seeds.size());
  v.detail = capitalised(sentence) + ".";
  const std::string recovery = recovery_clause(run);
  if (!recovery.empty())
    sentence = "after " + recovery + (span.recovered ? " (judged from there on, and by where it ended)" : "") + ": " +
               sentence;
  v.reason = capitalised(sentence) + ".";
  return v;
}

std::string verdict_for(const PolicyRun& run, const PolicyRun& baseline) {
  return judge_run(run, make_float32_band({baseline}), baseline).verdict;
}

void fill_comparison(PolicyRun& run, const PolicyRun& baseline, const Float32Band& band) {
  run.accuracy_delta = (run.test_accuracy - baseline.test_accuracy) * 100.0;  // NaN when either is missing
  run.speedup = ratio(run.steps_per_second, baseline.steps_per_second);
  run.memory_ratio = ratio(run.peak_memory_bytes, baseline.peak_memory_bytes);
  run.max_loss_deviation = max_relative_deviation(run.epoch_loss, baseline.epoch_loss);
  Verdict v = judge_run(run, band, baseline);
  run.verdict = v.verdict;
  run.numerics_verdict = v.numerics;
  run.verdict_reason = v.reason;
  run.checks = std::move(v.checks);
  run.judged_from_step = v.judged_from_step;
  run.fixed_threshold_verdict.clear();
  if (band.seeds.size() > 1 && run.verdict != "baseline") {
    const Verdict fixed = judge_run(run, make_float32_band({baseline}), baseline);
    run.fixed_threshold_verdict = fixed.numerics;
    if (fixed.numerics != run.numerics_verdict && run.numerics_verdict == "tracks")
      run.verdict_reason += " Against the float32 run of the same seed alone, the fixed thresholds would have said \"" +
                            fixed.numerics + "\" (" + lowercased_start(fixed.detail.substr(0, fixed.detail.size() - 1)) +
                            "), a difference float32's own seeds show too.";
  }
}

}  // namespace mixtrain
