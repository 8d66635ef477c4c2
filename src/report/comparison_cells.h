// What the terminal table and the HTML page of a comparison share: colors, the table's columns and cells.
// Internal to the report library.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "mixtrain/report/comparison.h"

namespace mixtrain::report_detail {

// Line colors by run order (the baseline, listed first, gets the first).
std::string run_color(size_t index);
std::string printf_string(const char* format, double value);

struct TableColumn {
  const char* header;
  bool left_aligned;
};
inline constexpr TableColumn kColumns[] = {
    {"policy", true},   {"final loss", false}, {"test acc", false}, {"Δacc (pt)", false},
    {"loss dev %", false}, {"steps/s", false},  {"speedup", false},  {"peak MiB", false},
    {"mem ratio", false}, {"skipped", false},  {"verdict", true},
};
inline constexpr size_t kColumnCount = sizeof kColumns / sizeof kColumns[0];

// One row of the results table; a missing value is "-".
std::vector<std::string> table_cells(const PolicyRun& run);
bool is_baseline(const PolicyRun& run);
// "verdict-no-speedup" from "no speedup": a CSS class name for a verdict.
std::string verdict_class(const std::string& verdict);

}  // namespace mixtrain::report_detail
