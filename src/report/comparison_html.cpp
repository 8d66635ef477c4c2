// The comparison report as one self-contained HTML page (see render_comparison_html in report/comparison.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "comparison_cells.h"
#include "mixtrain/report/comparison.h"
#include "mixtrain/report/svg_plot.h"

namespace mixtrain {

using namespace report_detail;

namespace {

constexpr const char* kBandColor = "#1f77b4";  // the float32 band takes the baseline's color, lighter

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
td.verdict, span.verdict { font-weight: 600; border-radius: 3px; padding: 1px 5px; }
.verdict-baseline { color: #1f4e8c; background: #e8f0fb; }
.verdict-tracks { color: #1d6b33; background: #e5f4e9; }
.verdict-no-speedup { color: #6b5a00; background: #fbf5d8; }
.verdict-deviates { color: #9a4a00; background: #fdebd9; }
.verdict-diverged { color: #a11d1d; background: #fbe2e2; }
table.dtypes td.float32 { color: #1f4e8c; font-weight: 600; }
table.dtypes td.switched { background: #fdebd9; }
.caption { color: #555; font-size: 13px; margin: 4px 0 12px; }
svg.chart { max-width: 100%; height: auto; border: 1px solid #e2e2e2; }
.bars svg.chart { margin-right: 12px; }
ul { margin: 6px 0; padding-left: 22px; }
li { margin: 2px 0; }
ul.reasons li { margin: 6px 0; }
)";

std::string seeds_text(const Float32Band& band) {
  std::string s;
  for (size_t i = 0; i < band.seeds.size(); ++i) s += (i ? ", " : "") + std::to_string(band.seeds[i]);
  return s;
}

bool has_band(const ComparisonReport& report) { return report.band.seeds.size() > 1; }

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
      if (m.action == "layers_to_float32" || m.action == "model_to_float32") {
        std::string layers;
        for (size_t l = 0; l < m.layers.size() && l < 3; ++l) layers += (l ? ", " : "") + m.layers[l];
        if (m.layers.size() > 3) layers += " +" + std::to_string(m.layers.size() - 3);
        label += (m.action == "model_to_float32" ? "model" : layers) + " → float32";
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
  if (report.batch_size_auto) {
    o.title = "Largest batch that fits";
    o.y_label = "rows";
    html += bar_chart_svg(batch, o);
  }
  html += "</div>\n<p class=\"caption\">Steps per second over the training steps (evaluation excluded); peak memory is "
          "the tensor allocator&#39;s peak during training above what was live before it.";
  if (report.batch_size_auto)
    html += " With --batch-size auto each policy trained with the largest batch whose measured step fits the memory "
            "budget: 16-bit activations leave room for more rows.";
  return html + "</p>\n";
}

std::string dtype_table(const ComparisonReport& report) {
  std::vector<std::string> layers;
  std::set<std::string> seen;
  for (const PolicyRun& run : report.runs)
    for (const auto& [name, dtype] : run.layer_dtypes)
      if (seen.insert(name).second) layers.push_back(name);
  if (layers.empty()) return "";
  std::string html = "<h2>Compute dtype of each layer at the end</h2>\n<table class=\"dtypes\">\n<thead><tr><th class=\"left\">layer</th>";
  for (const PolicyRun& run : report.runs) html += "<th>" + html_escape(run.policy) + "</th>";
  html += "</tr></thead>\n<tbody>\n";
  for (const std::string& layer : layers) {
    html += "<tr><td class=\"left\">" + html_escape(layer) + "</td>";
    for (const PolicyRun& run : report.runs) {
      std::string dtype = "-";
      for (const auto& [name, d] : run.layer_dtypes)
        if (name == layer) dtype = d;
      bool switched = false;
      for (const RecoveryMark& m : run.recovery)
        switched |= std::find(m.layers.begin(), m.layers.end(), layer) != m.layers.end();
      std::string cls = dtype == "float32" ? "float32" : "";
      if (switched) cls += " switched";
      html += "<td class=\"" + cls + "\">" + html_escape(dtype) + (switched ? " (recovery)" : "") + "</td>";
    }
    html += "</tr>\n";
  }
  html += "</tbody>\n</table>\n<p class=\"caption\">The dtype each layer computed in when training ended; "
          "&quot;(recovery)&quot; marks the layers the recovery moved to float32.</p>\n";
  return html;
}

}  // namespace

std::string render_comparison_html(const ComparisonReport& report) {
  const std::string title = report.title.empty() ? "mixtrain policy comparison" : report.title;
  const bool band = has_band(report);
  std::string html;
  html += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  html += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  html += "<title>" + html_escape(title) + "</title>\n<style>" + std::string(kStyle) + "</style>\n</head>\n<body>\n";
  html += "<h1>" + html_escape(title) + "</h1>\n";

  // Settings.
  std::string policies;
  for (const PolicyRun& run : report.runs) policies += (policies.empty() ? "" : ", ") + run.policy;
  html += "<table class=\"settings\">\n";
  std::vector<std::pair<std::string, std::string>> settings = {
      {"Model", report.model}, {"Data", report.data},       {"Seed", std::to_string(report.seed)},
      {"Epochs", std::to_string(report.epochs)},             {"Policies", policies},
  };
  if (band) settings.emplace_back("float32 seeds (band)", seeds_text(report.band));
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

  // Why each run got its verdict.
  html += "<h2>Why</h2>\n<ul class=\"reasons\">\n";
  for (const PolicyRun& run : report.runs) {
    if (run.verdict_reason.empty()) continue;
    html += "<li><b>" + html_escape(run.policy) + "</b> <span class=\"verdict " + verdict_class(run.verdict) + "\">" +
            html_escape(run.verdict) + "</span> " + html_escape(run.verdict_reason) + "</li>\n";
  }
  html += "</ul>\n";

  // Loss curves: smoothed per-step loss, or the per-epoch loss when no run recorded steps; float32's seed band
  // shaded behind them and the recovery actions marked.
  const bool per_step = std::any_of(report.runs.begin(), report.runs.end(),
                                    [](const PolicyRun& r) { return !r.step_loss.empty(); });
  std::vector<Series> loss_series;
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  bool all_positive = true;
  auto extend = [&](double v) {
    if (!std::isfinite(v)) return;
    all_positive &= v > 0;
    lo = std::min(lo, v), hi = std::max(hi, v);
  };
  for (size_t i = 0; i < report.runs.size(); ++i) {
    const PolicyRun& run = report.runs[i];
    Series s{run.policy, per_step ? smooth_loss(run.step_loss) : run.epoch_loss, run_color(i)};
    // The runs that track the baseline lie on top of it; a wide baseline line stays visible beneath them.
    if (is_baseline(run)) s.stroke_width = 4;
    for (double v : s.y) extend(v);
    loss_series.push_back(std::move(s));
  }
  std::vector<AreaBand> loss_bands;
  if (band) {
    const SeriesBand& b = per_step ? report.band.step_loss : report.band.epoch_loss;
    loss_bands.push_back({"float32 over " + std::to_string(report.band.seeds.size()) + " seeds", b.lo, b.hi, kBandColor});
    for (double v : b.lo) extend(v);
    for (double v : b.hi) extend(v);
  }
  ChartOptions loss_options;
  loss_options.title = per_step ? "Training loss per step (smoothed)" : "Training loss per epoch";
  loss_options.x_label = per_step ? "step" : "epoch";
  loss_options.y_label = "loss";
  loss_options.width = 1096;
  loss_options.height = 420;
  // Spanning more than two decades (a run that blew up), the curves only stay readable on a log axis.
  loss_options.log_y = all_positive && lo <= hi && hi / lo > 100;
  const std::vector<Marker> markers = recovery_markers(report, per_step);
  html += "<h2>Loss</h2>\n" + line_chart_svg(loss_series, loss_options, loss_bands, markers);
  if (per_step) {
    html += "<p class=\"caption\">Exponential moving average of each step&#39;s training loss: each point is " +
            printf_string("%g", kLossSmoothing) + " &times; the previous average + " +
            printf_string("%g", 1 - kLossSmoothing) +
            " &times; the step&#39;s loss, bias-corrected so the curve starts at the first loss. Gaps mark "
            "non-finite losses.";
  } else {
    html += "<p class=\"caption\">Mean training loss of each epoch. Gaps mark non-finite losses.";
  }
  if (band)
    html += " The shaded band spans the lowest to the highest of " + std::to_string(report.band.seeds.size()) +
            " float32 runs that differ only in seed (" + seeds_text(report.band) +
            "; initial weights and data order): float32&#39;s own run-to-run noise.";
  if (std::any_of(report.runs.begin(), report.runs.end(), is_baseline)) {
    html += " The baseline (seed " + std::to_string(report.seed) + ") is drawn wider, beneath the runs compared with it.";
  }
  if (!markers.empty())
    html += " Dashed lines mark recovery actions (compare --recover): the layers moved to float32 and the step "
            "training rolled back to; the curve after a rollback is the replayed run.";
  if (loss_options.log_y) html += " The y axis is logarithmic because the losses span more than two decades.";
  html += "</p>\n";

  // Validation loss per epoch (per evaluation interval), on its band.
  std::vector<Series> val_series;
  for (size_t i = 0; i < report.runs.size(); ++i)
    if (!report.runs[i].epoch_val_loss.empty())
      val_series.push_back({report.runs[i].policy, report.runs[i].epoch_val_loss, run_color(i),
                            is_baseline(report.runs[i]) ? 4.0 : 1.5});
  if (!val_series.empty()) {
    std::vector<AreaBand> val_bands;
    if (band)
      val_bands.push_back({"float32 over " + std::to_string(report.band.seeds.size()) + " seeds",
                           report.band.epoch_val_loss.lo, report.band.epoch_val_loss.hi, kBandColor});
    ChartOptions val_options;
    val_options.title = "Validation loss per epoch";
    val_options.x_label = "epoch";
    val_options.y_label = "validation loss";
    val_options.width = 1096;
    val_options.height = 300;
    html += "<h2>Validation loss</h2>\n" + line_chart_svg(val_series, val_options, val_bands);
    html += "<p class=\"caption\">The loss on the validation rows after each epoch (a run by steps: after each "
            "evaluation interval)" +
            std::string(band ? ", with float32&#39;s seed band shaded." : ".") + "</p>\n";
  }

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

  html += bar_charts(report);
  html += dtype_table(report);

  // How verdicts are decided, with the numbers the code uses.
  auto pct = [](double f) { return printf_string("%g", f * 100) + "%"; };
  html += "<h2>Verdicts</h2>\n";
  html += "<p class=\"caption\">Each run is judged against float32&#39;s band: the lowest to highest value of the "
          "float32 runs of every seed, widened by a tolerance of the larger of a multiple of the band&#39;s width and "
          "a fixed threshold against the first float32 run (the floor, so a tiny band does not flag noise). With one "
          "float32 seed the band is that run and the fixed thresholds apply alone.</p>\n";
  html += "<ul class=\"verdicts\">\n";
  html += "<li><b>baseline</b>: the float32 run the others share their seed with.</li>\n";
  html += "<li><b>diverged</b>: a loss became NaN or infinite; or the final training loss is above the band by more "
          "than " + printf_string("%g", kDivergedBandMargin) + " band widths and " +
          printf_string("%g", kDivergedFinalLossRatio - 1) +
          "&times; float32&#39;s final loss (a final loss over " + printf_string("%g", kDivergedFinalLossRatio) +
          "&times;); or at some step the smoothed loss is above the band by more than " +
          printf_string("%g", kDivergedBandMargin) + " widths and " + pct(kDivergedCurveDeviation) +
          " of float32&#39;s.</li>\n";
  html += "<li><b>deviates</b>: an epoch&#39;s training loss (the validation loss: at the last epoch or at most epochs) lies outside the band by more than " +
          printf_string("%g", kBandMargin) + " band width and " + pct(kDeviatesLossDeviation) +
          " of float32&#39;s; or test accuracy is below it by more than " + printf_string("%g", kBandMargin) +
          " width and " + printf_string("%g", kDeviatesAccuracyDrop) +
          " percentage point; or the test loss is above it by more than " + printf_string("%g", kBandMargin) +
          " width and " + pct(kDeviatesLossDeviation) + ".</li>\n";
  html += "<li><b>no speedup</b>: it tracks float32 but runs fewer steps per second.</li>\n";
  html += "<li><b>tracks</b>: none of the above.</li>\n";
  html += "<li>A run the recovery rolled back is judged from the step it resumed at: divergence from there on, "
          "deviation where it ended.</li>\n</ul>\n";

  if (!report.notes.empty()) {
    html += "<h2>Notes</h2>\n<ul class=\"notes\">\n";
    for (const std::string& note : report.notes) html += "<li>" + html_escape(note) + "</li>\n";
    html += "</ul>\n";
  }
  html += "</body>\n</html>\n";
  return html;
}

}  // namespace mixtrain
