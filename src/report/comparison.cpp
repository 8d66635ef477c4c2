#include "mixtrain/report/comparison.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "mixtrain/report/csv_writer.h"

namespace mixtrain {

namespace {

// Shortest text that reads back to the same double ("0.1", "nan", "inf").
std::string shortest(double v) {
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, result.ptr);
}

Json number_array(const std::vector<double>& values) {
  Json array = Json::array();
  for (double v : values) array.push_back(v);
  return array;
}

Json series_band_json(const SeriesBand& b) {
  return Json::object({{"lo", number_array(b.lo)}, {"hi", number_array(b.hi)}});
}
Json value_band_json(const ValueBand& b) { return Json::object({{"lo", b.lo}, {"hi", b.hi}, {"ref", b.ref}}); }

// compare --memory-plan's parts and the measured peak beside them (null without a plan).
Json memory_plan_json(const PolicyRun& run) {
  if (run.memory_plan.empty()) return Json();
  Json parts = Json::object();
  double total = 0;
  for (const auto& [name, bytes] : run.memory_plan) {
    parts[name] = bytes;
    total += bytes;
  }
  return Json::object({{"parts_bytes", parts}, {"total_bytes", total}, {"measured_bytes", run.measured_memory_bytes}});
}

Json thresholds_json() {
  return Json::object({
      {"diverged_final_loss_ratio", kDivergedFinalLossRatio},
      {"diverged_curve_deviation", kDivergedCurveDeviation},
      {"deviates_loss_deviation", kDeviatesLossDeviation},
      {"deviates_accuracy_drop_points", kDeviatesAccuracyDrop},
      {"band_margin", kBandMargin},
      {"diverged_band_margin", kDivergedBandMargin},
      {"min_speedup", kMinSpeedup},
      {"loss_smoothing", kLossSmoothing},
  });
}

Json seed_json(uint64_t seed) {
  constexpr uint64_t kExactDoubleLimit = uint64_t{1} << 53;
  return seed <= kExactDoubleLimit ? Json(seed) : Json(std::to_string(seed));
}

Json check_json(const BandCheck& c) {
  return Json::object({{"quantity", c.quantity},
                       {"kind", c.kind},
                       {"index", c.index},
                       {"value", c.value},
                       {"lo", c.lo},
                       {"hi", c.hi},
                       {"tolerance", c.tolerance},
                       {"excess", c.excess},
                       {"crossed", c.crossed},
                       {"points_outside", c.points_outside},
                       {"points_judged", c.points_judged}});
}

Json recovery_json(const RecoveryMark& m) {
  Json layers = Json::array();
  for (const std::string& l : m.layers) layers.push_back(l);
  Json j = Json::object({{"step", m.step}, {"action", m.action}, {"reason", m.reason}, {"layers", layers}});
  if (m.resume_step >= 0) j["resume_step"] = m.resume_step;
  return j;
}

}  // namespace

double final_loss(const PolicyRun& run) {
  if (!run.epoch_loss.empty()) return run.epoch_loss.back();
  if (!run.step_loss.empty()) return run.step_loss.back();
  return kNotMeasured;
}

std::vector<double> smooth_loss(const std::vector<double>& loss, double weight) {
  std::vector<double> smoothed(loss.size());
  double average = 0, correction = 1;  // correction = weight^t after t finite values
  for (size_t i = 0; i < loss.size(); ++i) {
    if (!std::isfinite(loss[i])) {
      smoothed[i] = loss[i];
      continue;
    }
    average = weight * average + (1 - weight) * loss[i];
    correction *= weight;
    smoothed[i] = average / (1 - correction);
  }
  return smoothed;
}

double max_relative_deviation(const std::vector<double>& values, const std::vector<double>& reference) {
  const size_t n = std::min(values.size(), reference.size());
  double worst = kNotMeasured;
  for (size_t i = 0; i < n; ++i) {
    const double r = reference[i], v = values[i];
    if (!std::isfinite(r)) continue;
    double d;
    if (!std::isfinite(v)) {
      d = std::numeric_limits<double>::infinity();
    } else if (r == 0) {
      d = v == 0 ? 0 : std::numeric_limits<double>::infinity();
    } else {
      d = std::fabs(v - r) / std::fabs(r);
    }
    if (std::isnan(worst) || d > worst) worst = d;
  }
  return worst;
}

Json comparison_to_json(const ComparisonReport& report) {
  Json json = Json::object({{"title", report.title}, {"model", report.model}, {"data", report.data}});
  json["seed"] = seed_json(report.seed);
  json["epochs"] = report.epochs;
  json["thresholds"] = thresholds_json();
  const Float32Band& band = report.band;
  Json seeds = Json::array();
  for (uint64_t s : band.seeds) seeds.push_back(seed_json(s));
  json["band"] = Json::object({
      {"seeds", seeds},
      {"step_loss", series_band_json(band.step_loss)},
      {"epoch_loss", series_band_json(band.epoch_loss)},
      {"epoch_val_loss", series_band_json(band.epoch_val_loss)},
      {"final_loss", value_band_json(band.final_loss)},
      {"test_loss", value_band_json(band.test_loss)},
      {"test_accuracy", value_band_json(band.test_accuracy)},
  });
  json["batch_size_auto"] = report.batch_size_auto;
  Json runs = Json::array();
  for (const PolicyRun& run : report.runs) {
    Json checks = Json::array(), recovery = Json::array(), layers = Json::object();
    for (const BandCheck& c : run.checks) checks.push_back(check_json(c));
    for (const RecoveryMark& m : run.recovery) recovery.push_back(recovery_json(m));
    for (const auto& [name, dtype] : run.layer_dtypes) layers[name] = dtype;
    runs.push_back(Json::object({
        {"policy", run.policy},
        {"seed", seed_json(run.seed)},
        {"batch_size", run.batch_size},
        {"verdict", run.verdict},
        {"verdict_reason", run.verdict_reason},
        {"numerics_verdict", run.numerics_verdict},
        {"fixed_threshold_verdict", run.fixed_threshold_verdict},
        {"judged_from_step", run.judged_from_step},
        {"checks", checks},
        {"final_loss", final_loss(run)},
        {"test_loss", run.test_loss},
        {"test_accuracy", run.test_accuracy},
        {"accuracy_delta", run.accuracy_delta},
        {"steps_per_second", run.steps_per_second},
        {"speedup", run.speedup},
        {"peak_memory_bytes", run.peak_memory_bytes},
        {"memory_ratio", run.memory_ratio},
        {"memory_plan", memory_plan_json(run)},
        {"max_loss_deviation", run.max_loss_deviation},
        {"skipped_steps", run.skipped_steps},
        {"recovery", recovery},
        {"layer_compute_dtypes", layers},
        {"epoch_loss", number_array(run.epoch_loss)},
        {"epoch_val_loss", number_array(run.epoch_val_loss)},
        {"step_loss", number_array(run.step_loss)},
        {"step_loss_scale", number_array(run.step_loss_scale)},
    }));
  }
  json["runs"] = std::move(runs);
  Json extra = Json::array();
  for (const PolicyRun& run : report.extra_seeds)
    extra.push_back(Json::object({
        {"seed", seed_json(run.seed)},
        {"final_loss", final_loss(run)},
        {"test_loss", run.test_loss},
        {"test_accuracy", run.test_accuracy},
        {"steps_per_second", run.steps_per_second},
        {"peak_memory_bytes", run.peak_memory_bytes},
        {"epoch_loss", number_array(run.epoch_loss)},
        {"epoch_val_loss", number_array(run.epoch_val_loss)},
    }));
  json["float32_seeds"] = std::move(extra);
  Json notes = Json::array();
  for (const std::string& note : report.notes) notes.push_back(note);
  json["notes"] = std::move(notes);
  return json;
}

void write_steps_csv(const std::string& path, const ComparisonReport& report) {
  CsvWriter csv(path, {"step", "policy", "loss", "loss_scale"});
  for (const PolicyRun& run : report.runs) {
    for (size_t i = 0; i < run.step_loss.size(); ++i) {
      const std::string scale = i < run.step_loss_scale.size() ? shortest(run.step_loss_scale[i]) : "";
      csv.row({std::to_string(i + 1), run.policy, shortest(run.step_loss[i]), scale});
    }
  }
}

}  // namespace mixtrain
