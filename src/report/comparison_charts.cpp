// The charts of the comparison's HTML page (see comparison_charts.h).
#include "comparison_charts.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <vector>

#include "comparison_cells.h"
#include "mixtrain/report/svg_plot.h"

namespace mixtrain::report_detail {

namespace {

constexpr const char* kBandColor = "#1f77b4";  // the float32 band takes the baseline's color, lighter

std::string band_name(const ComparisonReport& report) {
  return "float32 over " + std::to_string(report.band.seeds.size()) + " seeds";
}

// The recovery actions that changed how a run computes, as chart markers in the run's color.
std::vector<Marker> recovery_markers(const ComparisonReport& report, bool per_step) {
  std::vector<Marker> markers;
  for (size_t i = 0; i < report.runs.size(); ++i) {
    const PolicyRun& run = report.runs[i];
    const size_t epochs = run.epoch_loss.size();
    const size_t steps_per_epoch = epochs ? (run.step_loss.size() + epochs - 1) / epochs : 0;
    for (size_t k = 0; k < run.recovery.size(); ++k) {
      const RecoveryMark& m = run.recovery[k];
      if (m.action == "rollback") continue;
      std::string label = run.policy + ": ";
      if (m.action == "layers_to_float32" || m.action == "model_to_float32" || m.action == "layers_to_bfloat16") {
        std::string layers;
        for (size_t l = 0; l < m.layers.size() && l < 3; ++l) layers += (l ? ", " : "") + m.layers[l];
        if (m.layers.size() > 3) layers += " +" + std::to_string(m.layers.size() - 3);
        label += (m.action == "model_to_float32" ? "model" : layers) +
                 (m.action == "layers_to_bfloat16" ? " → bfloat16" : " → float32");
      } else {
        label += m.action;
      }
      // The rollback that follows says where training resumed.
      if (k + 1 < run.recovery.size() && run.recovery[k + 1].action == "rollback" && run.recovery[k + 1].resume_step >= 0)
        label += ", back to step " + std::to_string(run.recovery[k + 1].resume_step);
      double x = static_cast<double>(m.step);
      if (!per_step) x = steps_per_epoch ? static_cast<double>(m.step) / static_cast<double>(steps_per_epoch) : 1;
      markers.push_back({x, label, run_color(i)});
    }
  }
  return markers;
}

// The range of the finite values a chart draws, to choose its y axis.
struct ValueRange {
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  bool all_positive = true;

  void extend(double v) {
    if (!std::isfinite(v)) return;
    all_positive &= v > 0;
    lo = std::min(lo, v), hi = std::max(hi, v);
  }
  void extend(const std::vector<double>& values) {
    for (double v : values) extend(v);
  }
  // Spanning more than two decades (a run that blew up), the curves only stay readable on a log axis.
  bool wants_log_axis() const { return all_positive && lo <= hi && hi / lo > 100; }
};

// What the loss chart draws: a curve a run, float32's seed band behind them, and the kind of y axis.
struct LossCurves {
  std::vector<Series> series;
  std::vector<AreaBand> bands;
  bool log_y = false;
};

LossCurves loss_curves(const ComparisonReport& report, bool per_step) {
  LossCurves curves;
  ValueRange range;
  for (size_t i = 0; i < report.runs.size(); ++i) {
    const PolicyRun& run = report.runs[i];
    Series s{run.policy, per_step ? smooth_loss(run.step_loss) : run.epoch_loss, run_color(i)};
    // The runs that track the baseline lie on top of it; a wide baseline line stays visible beneath them.
    if (is_baseline(run)) s.stroke_width = 4;
    range.extend(s.y);
    curves.series.push_back(std::move(s));
  }
  if (has_band(report)) {
    const SeriesBand& b = per_step ? report.band.step_loss : report.band.epoch_loss;
    curves.bands.push_back({band_name(report), b.lo, b.hi, kBandColor});
    range.extend(b.lo);
    range.extend(b.hi);
  }
  curves.log_y = range.wants_log_axis();
  return curves;
}

// What the loss chart shows and how to read it.
std::string loss_caption(const ComparisonReport& report, bool per_step, bool has_markers, bool log_y) {
  std::string html;
  if (per_step) {
    html += "<p class=\"caption\">Exponential moving average of each step&#39;s training loss: each point is " +
            printf_string("%g", kLossSmoothing) + " &times; the previous average + " +
            printf_string("%g", 1 - kLossSmoothing) +
            " &times; the step&#39;s loss, bias-corrected so the curve starts at the first loss. Gaps mark "
            "non-finite losses.";
  } else {
    html += "<p class=\"caption\">Mean training loss of each epoch. Gaps mark non-finite losses.";
  }
  if (has_band(report))
    html += " The shaded band spans the lowest to the highest of " + std::to_string(report.band.seeds.size()) +
            " float32 runs that differ only in seed (" + seeds_text(report.band) +
            "; initial weights and data order): float32&#39;s own run-to-run noise.";
  if (std::any_of(report.runs.begin(), report.runs.end(), is_baseline)) {
    html += " The baseline (seed " + std::to_string(report.seed) + ") is drawn wider, beneath the runs compared with it.";
  }
  if (has_markers)
    html += " Dashed lines mark recovery actions (compare --recover): the layers moved to float32 and the step "
            "training rolled back to; the curve after a rollback is the replayed run.";
  if (log_y) html += " The y axis is logarithmic because the losses span more than two decades.";
  return html + "</p>\n";
}

}  // namespace

bool has_band(const ComparisonReport& report) { return report.band.seeds.size() > 1; }

std::string seeds_text(const Float32Band& band) {
  std::string s;
  for (size_t i = 0; i < band.seeds.size(); ++i) s += (i ? ", " : "") + std::to_string(band.seeds[i]);
  return s;
}

std::string loss_chart(const ComparisonReport& report) {
  // Smoothed per-step loss, or the per-epoch loss when no run recorded steps.
  const bool per_step = std::any_of(report.runs.begin(), report.runs.end(),
                                    [](const PolicyRun& r) { return !r.step_loss.empty(); });
  const LossCurves curves = loss_curves(report, per_step);
  ChartOptions options;
  options.title = per_step ? "Training loss per step (smoothed)" : "Training loss per epoch";
  options.x_label = per_step ? "step" : "epoch";
  options.y_label = "loss";
  options.width = 1096;
  options.height = 420;
  options.log_y = curves.log_y;
  const std::vector<Marker> markers = recovery_markers(report, per_step);
  return "<h2>Loss</h2>\n" + line_chart_svg(curves.series, options, curves.bands, markers) +
         loss_caption(report, per_step, !markers.empty(), options.log_y);
}

std::string validation_chart(const ComparisonReport& report) {
  // Per epoch (per evaluation interval of a run by steps), on its band.
  std::vector<Series> series;
  for (size_t i = 0; i < report.runs.size(); ++i)
    if (!report.runs[i].epoch_val_loss.empty())
      series.push_back({report.runs[i].policy, report.runs[i].epoch_val_loss, run_color(i),
                        is_baseline(report.runs[i]) ? 4.0 : 1.5});
  if (series.empty()) return "";
  const bool band = has_band(report);
  std::vector<AreaBand> bands;
  if (band)
    bands.push_back({band_name(report), report.band.epoch_val_loss.lo, report.band.epoch_val_loss.hi, kBandColor});
  ChartOptions options;
  options.title = "Validation loss per epoch";
  options.x_label = "epoch";
  options.y_label = "validation loss";
  options.width = 1096;
  options.height = 300;
  std::string html = "<h2>Validation loss</h2>\n" + line_chart_svg(series, options, bands);
  html += "<p class=\"caption\">The loss on the validation rows after each epoch (a run by steps: after each "
          "evaluation interval)" +
          std::string(band ? ", with float32&#39;s seed band shaded." : ".") + "</p>\n";
  return html;
}

std::string loss_scale_chart(const ComparisonReport& report) {
  std::vector<Series> series;
  for (size_t i = 0; i < report.runs.size(); ++i) {
    const PolicyRun& run = report.runs[i];
    if (run.step_loss_scale.empty()) continue;
    series.push_back({run.policy, run.step_loss_scale, run_color(i)});
  }
  if (series.empty()) return "";
  ChartOptions options;
  options.title = "Loss scale per step";
  options.x_label = "step";
  options.y_label = "loss scale";
  options.width = 1096;
  options.height = 260;
  options.log_y = true;
  std::string html = "<h2>Loss scale</h2>\n" + line_chart_svg(series, options);
  html += "<p class=\"caption\">Dynamic loss scaling halves the scale when gradients overflow (the step is skipped) "
          "and doubles it after a run of finite steps. Log y axis.</p>\n";
  return html;
}

namespace {
// compare --memory-plan's stacked bars: each policy's planned parts bottom up, its measured peak as a line.
std::vector<Bar> memory_plan_bars(const ComparisonReport& report) {
  // One color per part, in the plan's order: state in blues and greens, the step's part in orange.
  static const char* const kPartColors[] = {"#1f4e79", "#4f81bd", "#9bbb59", "#c0c0c0", "#f79646", "#e46c0a"};
  std::vector<Bar> bars;
  for (const PolicyRun& run : report.runs) {
    Bar bar{run.policy, 0.0, "", "", {}, run.measured_memory_bytes / (1024.0 * 1024.0)};
    for (size_t k = 0; k < run.memory_plan.size(); ++k) {
      const double mib = run.memory_plan[k].second / (1024.0 * 1024.0);
      bar.parts.push_back({run.memory_plan[k].first, mib, kPartColors[k % std::size(kPartColors)]});
      bar.value += mib;
    }
    if (run.memory_plan.empty()) bar.value = std::nan("");
    bar.value_text = printf_string("%.1f MiB", bar.value);
    bars.push_back(std::move(bar));
  }
  return bars;
}
}  // namespace

std::string bar_charts(const ComparisonReport& report) {
  std::vector<Bar> speed, memory, batch;
  for (size_t i = 0; i < report.runs.size(); ++i) {
    const PolicyRun& run = report.runs[i];
    speed.push_back({run.policy, run.steps_per_second, run_color(i), printf_string("%.1f", run.steps_per_second)});
    const double mib = run.peak_memory_bytes / (1024.0 * 1024.0);
    memory.push_back({run.policy, mib, run_color(i), printf_string("%.1f MiB", mib)});
    batch.push_back({run.policy, run.batch_size > 0 ? static_cast<double>(run.batch_size) : std::nan(""),
                     run_color(i), std::to_string(run.batch_size)});
  }
  BarChartOptions o;
  o.width = 350;
  o.height = 260;
  std::string html = "<h2>Speed and memory</h2>\n<div class=\"bars\">\n";
  o.title = "Training steps per second";
  o.y_label = "steps/s";
  html += bar_chart_svg(speed, o);
  o.title = "Peak memory during training";
  o.y_label = "MiB";
  html += bar_chart_svg(memory, o);
  if (std::any_of(report.runs.begin(), report.runs.end(), [](const PolicyRun& r) { return !r.memory_plan.empty(); })) {
    o.title = "Where memory goes (plan; line: measured)";
    o.y_label = "MiB";
    html += bar_chart_svg(memory_plan_bars(report), o);
  }
  if (report.batch_size_auto) {
    o.title = "Largest batch that fits";
    o.y_label = "rows";
    html += bar_chart_svg(batch, o);
  }
  html += "</div>\n<p class=\"caption\">Steps per second over the training steps (evaluation excluded); peak memory is "
          "the tensor allocator&#39;s peak during training above what was live before it.";
  if (!report.runs.empty() && !report.runs.front().memory_plan.empty()) {
    html += " With --memory-plan, the plan&#39;s parts from the bottom:";
    for (const auto& [name, bytes] : report.runs.front().memory_plan) html += " " + html_escape(name) + ",";
    html.back() = ';';
    html += " the line is the run&#39;s measured peak, the model&#39;s bytes included.";
  }
  if (report.batch_size_auto)
    html += " With --batch-size auto each policy trained with the largest batch whose measured step fits the memory "
            "budget: 16-bit activations leave room for more rows.";
  return html + "</p>\n";
}

}  // namespace mixtrain::report_detail
