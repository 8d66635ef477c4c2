// The comparison report as one self-contained HTML page (see render_comparison_html in report/comparison.h):
// its text and tables here, its charts in comparison_charts.cpp.
#include <algorithm>
#include <set>

#include "comparison_cells.h"
#include "comparison_charts.h"
#include "mixtrain/report/comparison.h"
#include "mixtrain/report/svg_plot.h"

namespace mixtrain {

using namespace report_detail;

namespace {

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

std::string page_head(const std::string& title) {
  std::string html;
  html += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  html += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  html += "<title>" + html_escape(title) + "</title>\n<style>" + std::string(kStyle) + "</style>\n</head>\n<body>\n";
  html += "<h1>" + html_escape(title) + "</h1>\n";
  return html;
}

std::string settings_table(const ComparisonReport& report) {
  std::string policies;
  for (const PolicyRun& run : report.runs) policies += (policies.empty() ? "" : ", ") + run.policy;
  std::string html = "<table class=\"settings\">\n";
  std::vector<std::pair<std::string, std::string>> settings = {
      {"Model", report.model}, {"Data", report.data},       {"Seed", std::to_string(report.seed)},
      {"Epochs", std::to_string(report.epochs)},             {"Policies", policies},
  };
  if (has_band(report)) settings.emplace_back("float32 seeds (band)", seeds_text(report.band));
  for (const auto& [name, value] : settings) {
    html += "<tr><th>" + html_escape(name) + "</th><td>" + html_escape(value) + "</td></tr>\n";
  }
  html += "</table>\n";
  return html;
}

std::string results_table(const ComparisonReport& report) {
  std::string html = "<h2>Results</h2>\n<table class=\"results\">\n<thead><tr>";
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
  return html;
}

// Why each run got its verdict.
std::string verdict_reasons(const ComparisonReport& report) {
  std::string html = "<h2>Why</h2>\n<ul class=\"reasons\">\n";
  for (const PolicyRun& run : report.runs) {
    if (run.verdict_reason.empty()) continue;
    html += "<li><b>" + html_escape(run.policy) + "</b> <span class=\"verdict " + verdict_class(run.verdict) + "\">" +
            html_escape(run.verdict) + "</span> " + html_escape(run.verdict_reason) + "</li>\n";
  }
  html += "</ul>\n";
  return html;
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

// How verdicts are decided, with the numbers the code uses.
std::string verdict_rules() {
  auto pct = [](double f) { return printf_string("%g", f * 100) + "%"; };
  std::string html = "<h2>Verdicts</h2>\n";
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
  return html;
}

std::string notes_list(const ComparisonReport& report) {
  if (report.notes.empty()) return "";
  std::string html = "<h2>Notes</h2>\n<ul class=\"notes\">\n";
  for (const std::string& note : report.notes) html += "<li>" + html_escape(note) + "</li>\n";
  html += "</ul>\n";
  return html;
}

}  // namespace

std::string render_comparison_html(const ComparisonReport& report) {
  std::string html = page_head(report.title.empty() ? "mixtrain policy comparison" : report.title);
  html += settings_table(report);
  html += results_table(report);
  html += verdict_reasons(report);
  html += loss_chart(report);
  html += validation_chart(report);
  html += loss_scale_chart(report);
  html += bar_charts(report);
  html += dtype_table(report);
  html += verdict_rules();
  html += notes_list(report);
  html += "</body>\n</html>\n";
  return html;
}

}  // namespace mixtrain
