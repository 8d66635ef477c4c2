// What the terminal table and the HTML page of a comparison share (see comparison_cells.h).
#include "comparison_cells.h"

#include <cctype>
#include <cmath>
#include <cstdio>

#include "mixtrain/report/progress_bar.h"

namespace mixtrain::report_detail {

std::string run_color(size_t index) {
  static constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                             "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
  return kPalette[index % (sizeof kPalette / sizeof kPalette[0])];
}

std::string printf_string(const char* format, double value) {
  char buf[64];
  const int n = std::snprintf(buf, sizeof buf, format, value);
  return std::string(buf, static_cast<size_t>(n > 0 ? n : 0));
}

namespace {
std::string cell_or_dash(double v, const char* format) { return std::isnan(v) ? "-" : printf_string(format, v); }

std::string percent_cell(double fraction) {
  if (std::isnan(fraction)) return "-";
  if (std::isinf(fraction)) return fraction > 0 ? "inf" : "-inf";
  return printf_string("%.2f%%", fraction * 100.0);
}
}  // namespace

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

bool is_baseline(const PolicyRun& run) {
  return run.verdict == "baseline" || (run.verdict.empty() && run.policy == "float32");
}

std::string verdict_class(const std::string& verdict) {
  std::string name = "verdict-";
  for (char c : verdict) name += (std::isalnum(static_cast<unsigned char>(c)) ? c : '-');
  return name;
}

}  // namespace mixtrain::report_detail
