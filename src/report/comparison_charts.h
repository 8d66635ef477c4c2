// The charts of the comparison's HTML page, each an <h2> section with its SVG and caption: the loss curves on
// float32's seed band with the recovery actions marked, the validation loss, the loss scale, and the bar charts of
// speed, memory and batch size. Internal to the report library.
#pragma once

#include <string>

#include "mixtrain/report/comparison.h"

namespace mixtrain::report_detail {

// Whether the report has a float32 seed band to draw (more than one seed), and its seeds as "42, 43, 44".
bool has_band(const ComparisonReport& report);
std::string seeds_text(const Float32Band& band);

// The smoothed per-step training loss of every run (the per-epoch loss when no run recorded steps).
std::string loss_chart(const ComparisonReport& report);
// The validation loss per epoch; empty when no run has one.
std::string validation_chart(const ComparisonReport& report);
// The loss scale per step on a log axis; empty when no run scales its loss.
std::string loss_scale_chart(const ComparisonReport& report);
// Steps per second, peak memory and (with --batch-size auto) the batch size of each run.
std::string bar_charts(const ComparisonReport& report);

}  // namespace mixtrain::report_detail
