#include "mixtrain/report/comparison.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "mixtrain/report/csv_writer.h"
#include "mixtrain/report/progress_bar.h"
#include "mixtrain/report/svg_plot.h"

namespace mixtrain {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Line colors by run order (the baseline, listed first, gets the first).
constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                    "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
std::string run_color(size_t index) { return kPalette[index % (sizeof kPalette / sizeof kPalette[0])]; }

std::string printf_string(const char* format, double value) {
  char buf[64];
  const int n = std::snprintf(buf, sizeof buf, format, value);
  return std::string(buf, static_cast<size_t>(n > 0 ? n : 0));
}

// Shortest text that reads back to the same double ("0.1", "nan", "inf").
std::string shortest(double v) {
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, result.ptr);
}

bool all_finite(const std::vector<double>& values) {
  return std::all_of(values.begin(), values.end(), [](double v) { return std::isfinite(v); });
}

double ratio(double value, double reference) {
  if (!std::isfinite(value) || !std::isfinite(reference) || reference == 0) return kNaN;
  return value / reference;
}

double accuracy_delta_points(const PolicyRun& run, const PolicyRun& baseline) {
  return (run.test_accuracy - baseline.test_accuracy) * 100.0;  // NaN when either is missing
}

// Table cells; a missing value is "-".
std::string cell_or_dash(double v, const char* format) { return std::isnan(v) ? "-" : printf_string(format, v); }

std::string percent_cell(double fraction) {
  if (std::isnan(fraction)) return "-";
  if (std::isinf(fraction)) return fraction > 0 ? "inf" : "-inf";
  return printf_string("%.2f%%", fraction * 100.0);
}

struct TableColumn {
  const char* header;
  bool left_aligned;
};
constexpr TableColumn kColumns[] = {
    {"policy", true},   {"final loss", false}, {"test acc", false}, {"Δacc (pt)", false},
    {"loss dev %", false}, {"steps/s", false},  {"speedup", false},  {"peak MiB", false},
    {"mem ratio", false}, {"skipped", false},  {"verdict", true},
};
constexpr size_t kColumnCount = sizeof kColumns / sizeof kColumns[0];

std::vector<std::string> table_cells(const PolicyRun& run) {
  return {
      run.policy,
      format_metric_value(final_loss(run)),
      std::isnan(run.test_accuracy) ? "-" : printf_string("%.2f%%", run.test_accuracy * 100.0),
      cell_or_dash(run.accuracy_delta, "%+.2f"),
      percent_cell(run.max_loss_deviation),
      cell_or_dash(run.steps_per_second, "%.1f"),
      cell_or_dash(run.speedup, "%.2fx"),
      cell_or_dash(run.peak_memory_bytes / (1024.0 * 1024.0), "%.1f"),
      cell_or_dash(run.memory_ratio, "%.2fx"),
      std::to_string(run.skipped_steps),
      run.verdict,
  };
}

// Display width of UTF-8 text, counted in code points.
size_t text_width(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

Json number_array(const std::vector<double>& values) {
  Json array = Json::array();
  for (double v : values) array.push_back(v);
  return array;
}

bool is_baseline(const PolicyRun& run) {
  return run.verdict == "baseline" || (run.verdict.empty() && run.policy == "float32");
}

// "verdict-no-speedup" from "no speedup": a CSS class name for a verdict.
std::string verdict_class(const std::string& verdict) {
  std::string name = "verdict-";
  for (char c : verdict) name += (std::isalnum(static_cast<unsigned char>(c)) ? c : '-');
  return name;
}

constexpr const char* kStyle = R"(
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #222;
       max-width: 1100px; margin: 24px auto; padding: 0 16px; line-height: 1.4; }
h1 { font-size: 24px; margin: 0 0 12px; }
h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; font-size: 14px; }
th, td { padding: 5px 10px; border-bottom: 1px solid #e2e2e2; text-align: right; white-space: nowrap; }
th { background: #f4f4f4; font-weight: 600; }
th.left, td.left { text-align: left; }
table.settings th, table.settings td { text-align: left; padding: 3px 10px; }
table.settings th { background: none; font-weight: 600; }
td.verdict { font-weight: 600; border-radius: 3px; }
.verdict-baseline { color: #1f4e8c; background: #e8f0fb; }
.verdict-tracks { color: #1d6b33; background: #e5f4e9; }
.verdict-no-speedup { color: #6b5a00; background: #fbf5d8; }
.verdict-deviates { color: #9a4a00; background: #fdebd9; }
.verdict-diverged { color: #a11d1d; background: #fbe2e2; }
.caption { color: #555; font-size: 13px; margin: 4px 0 12px; }
svg.chart { max-width: 100%; height: auto; border: 1px solid #e2e2e2; }
ul { margin: 6px 0; padding-left: 22px; }
li { margin: 2px 0; }
)";

}  // namespace

double final_loss(const PolicyRun& run) {
  if (!run.epoch_loss.empty()) return run.epoch_loss.back();
  if (!run.step_loss.empty()) return run.step_loss.back();
  return kNaN;
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
  double worst = kNaN;
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

std::string verdict_for(const PolicyRun& run, const PolicyRun& baseline) {
  if (run.policy == baseline.policy) return "baseline";

  const bool non_finite_loss =
      !all_finite(run.step_loss) || !all_finite(run.epoch_loss) || !all_finite(run.epoch_val_loss);
  const double final_run = final_loss(run), final_base = final_loss(baseline);
  const bool final_too_high =
      std::isfinite(final_base) && final_run > final_base * kDivergedFinalLossRatio + kThresholdSlack;
  const double curve_deviation =
      max_relative_deviation(smooth_loss(run.step_loss), smooth_loss(baseline.step_loss));
  if (non_finite_loss || final_too_high || curve_deviation > kDivergedCurveDeviation + kThresholdSlack) {
    return "diverged";
  }

  const double loss_deviation = max_relative_deviation(run.epoch_loss, baseline.epoch_loss);
  const double accuracy_delta = accuracy_delta_points(run, baseline);
  if (loss_deviation > kDeviatesLossDeviation + kThresholdSlack ||
      accuracy_delta < -kDeviatesAccuracyDrop - kThresholdSlack) {
    return "deviates";
  }

  if (ratio(run.steps_per_second, baseline.steps_per_second) < kMinSpeedup - kThresholdSlack) return "no speedup";
  return "tracks";
}

void fill_comparison(PolicyRun& run, const PolicyRun& baseline) {
  run.accuracy_delta = accuracy_delta_points(run, baseline);
  run.speedup = ratio(run.steps_per_second, baseline.steps_per_second);
  run.memory_ratio = ratio(run.peak_memory_bytes, baseline.peak_memory_bytes);
  run.max_loss_deviation = max_relative_deviation(run.epoch_loss, baseline.epoch_loss);
  run.verdict = verdict_for(run, baseline);
}

std::string format_comparison_table(const ComparisonReport& report) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header;
  for (const TableColumn& c : kColumns) header.push_back(c.header);
  rows.push_back(header);
  for (const PolicyRun& run : report.runs) rows.push_back(table_cells(run));

  size_t widths[kColumnCount] = {};
  for (const auto& row : rows) {
    for (size_t c = 0; c < kColumnCount; ++c) widths[c] = std::max(widths[c], text_width(row[c]));
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < kColumnCount; ++c) {
      const std::string padding(widths[c] - text_width(row[c]), ' ');
      if (c) line += "  ";
      line += kColumns[c].left_aligned ? row[c] + padding : padding + row[c];
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

Json comparison_to_json(const ComparisonReport& report) {
  Json json = Json::object({{"title", report.title}, {"model", report.model}, {"data", report.data}});
  constexpr uint64_t kExactDoubleLimit = uint64_t{1} << 53;
  json["seed"] = report.seed <= kExactDoubleLimit ? Json(report.seed) : Json(std::to_string(report.seed));
  json["epochs"] = report.epochs;
  json["thresholds"] = Json::object({
      {"diverged_final_loss_ratio", kDivergedFinalLossRatio},
      {"diverged_curve_deviation", kDivergedCurveDeviation},
      {"deviates_loss_deviation", kDeviatesLossDeviation},
      {"deviates_accuracy_drop_points", kDeviatesAccuracyDrop},
      {"min_speedup", kMinSpeedup},
      {"loss_smoothing", kLossSmoothing},
  });
  Json runs = Json::array();
  for (const PolicyRun& run : report.runs) {
    runs.push_back(Json::object({
        {"policy", run.policy},
        {"verdict", run.verdict},
        {"final_loss", final_loss(run)},
        {"test_loss", run.test_loss},
        {"test_accuracy", run.test_accuracy},
        {"accuracy_delta", run.accuracy_delta},
        {"steps_per_second", run.steps_per_second},
        {"speedup", run.speedup},
        {"peak_memory_bytes", run.peak_memory_bytes},
        {"memory_ratio", run.memory_ratio},
        {"max_loss_deviation", run.max_loss_deviation},
        {"skipped_steps", run.skipped_steps},
        {"epoch_loss", number_array(run.epoch_loss)},
        {"epoch_val_loss", number_array(run.epoch_val_loss)},
        {"step_loss", number_array(run.step_loss)},
        {"step_loss_scale", number_array(run.step_loss_scale)},
    }));
  }
  json["runs"] = std::move(runs);
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

std::string render_comparison_html(const ComparisonReport& report) {
  const std::string title = report.title.empty() ? "mixtrain policy comparison" : report.title;
  std::string html;
  html += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  html += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  html += "<title>" + html_escape(title) + "</title>\n<style>" + std::string(kStyle) + "</style>\n</head>\n<body>\n";
  html += "<h1>" + html_escape(title) + "</h1>\n";

  // Settings.
  std::string policies;
  for (const PolicyRun& run : report.runs) policies += (policies.empty() ? "" : ", ") + run.policy;
  html += "<table class=\"settings\">\n";
  const std::pair<const char*, std::string> settings[] = {
      {"Model", report.model}, {"Data", report.data},     {"Seed", std::to_string(report.seed)},
      {"Epochs", std::to_string(report.epochs)},           {"Policies", policies},
  };
  for (const auto& [name, value] : settings) {
    html += "<tr><th>" + html_escape(name) + "</th><td>" + html_escape(value) + "</td></tr>\n";
  }
  html += "</table>\n";

  // Results table.
  html += "<h2>Results</h2>\n<table class=\"results\">\n<thead><tr>";
  for (const TableColumn& c : kColumns) {
    html += std::string("<th") + (c.left_aligned ? " class=\"left\"" : "") + ">" + html_escape(c.header) + "</th>";
  }
  html += "</tr></thead>\n<tbody>\n";
  for (const PolicyRun& run : report.runs) {
    const std::vector<std::string> cells = table_cells(run);
    html += "<tr>";
    for (size_t c = 0; c < kColumnCount; ++c) {
      std::string cls = kColumns[c].left_aligned ? "left" : "";
      if (c + 1 == kColumnCount) cls += " verdict " + verdict_class(run.verdict);
      html += "<td" + (cls.empty() ? std::string() : " class=\"" + cls + "\"") + ">" + html_escape(cells[c]) + "</td>";
    }
    html += "</tr>\n";
  }
  html += "</tbody>\n</table>\n";
  html += "<p class=\"caption\">Final loss is the last epoch's training loss. Δacc, loss dev, speedup and mem ratio "
          "are relative to the float32 baseline; loss dev is the largest relative difference of the per-epoch training "
          "loss. Skipped counts optimizer steps the loss scaler skipped because gradients overflowed.</p>\n";

  // Loss curves: smoothed per-step loss, or the per-epoch loss when no run recorded steps.
  const bool per_step = std::any_of(report.runs.begin(), report.runs.end(),
                                    [](const PolicyRun& r) { return !r.step_loss.empty(); });
  std::vector<Series> loss_series;
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  bool all_positive = true;
  for (size_t i = 0; i < report.runs.size(); ++i) {
    const PolicyRun& run = report.runs[i];
    Series s{run.policy, per_step ? smooth_loss(run.step_loss) : run.epoch_loss, run_color(i)};
    // The runs that track the baseline lie on top of it; a wide baseline line stays visible beneath them.
    if (is_baseline(run)) s.stroke_width = 4;
    for (double v : s.y) {
      if (!std::isfinite(v)) continue;
      all_positive &= v > 0;
      lo = std::min(lo, v), hi = std::max(hi, v);
    }
    loss_series.push_back(std::move(s));
  }
  ChartOptions loss_options;
  loss_options.title = per_step ? "Training loss per step (smoothed)" : "Training loss per epoch";
  loss_options.x_label = per_step ? "step" : "epoch";
  loss_options.y_label = "loss";
  loss_options.width = 1096;
  loss_options.height = 400;
  // Spanning more than two decades (a run that blew up), the curves only stay readable on a log axis.
  loss_options.log_y = all_positive && lo <= hi && hi / lo > 100;
  html += "<h2>Loss</h2>\n" + line_chart_svg(loss_series, loss_options);
  if (per_step) {
    html += "<p class=\"caption\">Exponential moving average of each step&#39;s training loss: each point is " +
            printf_string("%g", kLossSmoothing) + " &times; the previous average + " +
            printf_string("%g", 1 - kLossSmoothing) +
            " &times; the step&#39;s loss, bias-corrected so the curve starts at the first loss. Gaps mark "
            "non-finite losses.";
  } else {
    html += "<p class=\"caption\">Mean training loss of each epoch. Gaps mark non-finite losses.";
  }
  if (std::any_of(report.runs.begin(), report.runs.end(), is_baseline)) {
    html += " The baseline is drawn wider, beneath the runs compared with it.";
  }
  if (loss_options.log_y) html += " The y axis is logarithmic because the losses span more than two decades.";
  html += "</p>\n";

  // Loss scale, for the runs that scale the loss.
  std::vector<Series> scale_series;
  for (size_t i = 0; i < report.runs.size(); ++i) {
    const PolicyRun& run = report.runs[i];
    if (run.step_loss_scale.empty()) continue;
    scale_series.push_back({run.policy, run.step_loss_scale, run_color(i)});
  }
  if (!scale_series.empty()) {
    ChartOptions scale_options;
    scale_options.title = "Loss scale per step";
    scale_options.x_label = "step";
    scale_options.y_label = "loss scale";
    scale_options.width = 1096;
    scale_options.height = 260;
    scale_options.log_y = true;
    html += "<h2>Loss scale</h2>\n" + line_chart_svg(scale_series, scale_options);
    html += "<p class=\"caption\">Dynamic loss scaling halves the scale when gradients overflow (the step is skipped) "
            "and doubles it after a run of finite steps. Log y axis.</p>\n";
  }

  // How verdicts are decided, with the numbers the code uses.
  html += "<h2>Verdicts</h2>\n<ul class=\"verdicts\">\n";
  html += "<li><b>baseline</b>: the float32 run the others are compared with.</li>\n";
  html += "<li><b>diverged</b>: a loss became NaN or infinite, the final loss is above " +
          printf_string("%g", kDivergedFinalLossRatio) +
          "&times; the baseline&#39;s, or the smoothed per-step loss curve differs from the baseline&#39;s by more "
          "than " +
          printf_string("%g", kDivergedCurveDeviation * 100) + "% at some step.</li>\n";
  html += "<li><b>deviates</b>: the per-epoch training loss differs from the baseline&#39;s by more than " +
          printf_string("%g", kDeviatesLossDeviation * 100) + "%, or test accuracy is more than " +
          printf_string("%g", kDeviatesAccuracyDrop) + " percentage point below it.</li>\n";
  html += "<li><b>no speedup</b>: it tracks the baseline but runs fewer steps per second.</li>\n";
  html += "<li><b>tracks</b>: none of the above.</li>\n</ul>\n";

  if (!report.notes.empty()) {
    html += "<h2>Notes</h2>\n<ul class=\"notes\">\n";
    for (const std::string& note : report.notes) html += "<li>" + html_escape(note) + "</li>\n";
    html += "</ul>\n";
  }
  html += "</body>\n</html>\n";
  return html;
}

}  // namespace mixtrain
