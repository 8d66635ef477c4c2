// The comparison as a fixed-width terminal table (see format_comparison_table in report/comparison.h).
#include <algorithm>
#include <string>
#include <vector>

#include "comparison_cells.h"
#include "mixtrain/report/comparison.h"

namespace mixtrain {

using namespace report_detail;

namespace {

// Display width of UTF-8 text, counted in code points.
size_t text_width(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

std::string format_comparison_table(const ComparisonReport& report) {
  using report_detail::kColumnCount;
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

}  // namespace mixtrain
