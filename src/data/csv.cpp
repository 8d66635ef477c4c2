#include "mixtrain/data/csv.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>
#include <vector>

#include "mixtrain/core/file_checks.h"

namespace mixtrain {

namespace {

constexpr const char* kCsvHint =
    "expected a header row, then rows of numeric features with an integer class id (0, 1, ...) in the last column";

std::string_view trim(std::string_view s) {
  const char* ws = " \t\r\n\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// Splits one line at commas. A cell may be double-quoted, with "" standing for one quote inside it.
std::vector<std::string> split_cells(std::string_view line, const std::string& path, int64_t line_no) {
  std::vector<std::string> cells;
  std::string cur;
  bool in_quotes = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_quotes) {
      if (c != '"') {
        cur += c;
      } else if (i + 1 < line.size() && line[i + 1] == '"') {
        cur += '"';
        ++i;
      } else {
        in_quotes = false;
      }
    } else if (c == '"' && trim(cur).empty()) {
      in_quotes = true;
      cur.clear();
    } else if (c == ',') {
      cells.emplace_back(trim(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (in_quotes)
    MIXTRAIN_FAIL(kInvalidInput, "CSV file '" << path << "' line " << line_no << ": a quoted cell is not closed",
                  "close the quote with \" before the end of the line");
  cells.emplace_back(trim(cur));
  return cells;
}

std::optional<double> parse_number(std::string_view s) {
  if (s.size() > 1 && s[0] == '+' && s[1] != '-') s.remove_prefix(1);  // from_chars rejects a leading '+'
  if (s.empty()) return std::nullopt;
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

std::string read_file(const std::string& path) {
  require_regular_file(path, "CSV file");
  std::ifstream in(path, std::ios::binary);
  if (!in) MIXTRAIN_FAIL(kIo, "cannot open CSV file '" << path << "': " << std::strerror(errno), "check permissions");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) MIXTRAIN_FAIL(kIo, "error reading CSV file '" << path << "'", "check the file");
  return ss.str();
}

struct CsvReader {
  const std::string& path;
  std::vector<std::string> columns;
  std::vector<float> features;  // (N * F) row-major
  std::vector<int32_t> labels;  // (N,)

  std::string column_label(size_t c) const { return "column " + std::to_string(c + 1) + " '" + columns[c] + "'"; }

  [[noreturn]] void fail_cell(int64_t line_no, size_t c, const std::string& cell, const char* problem) const {
    MIXTRAIN_FAIL(
        kInvalidInput,
        "CSV file '" << path << "' line " << line_no << ", " << column_label(c) << ": '" << cell << "' " << problem,
        c + 1 == columns.size() ? "the last column must hold integer class ids 0, 1, ... (map class names to ids first)"
                                : kCsvHint);
  }

  void read_header(const std::vector<std::string>& cells, int64_t line_no) {
    if (cells.size() < 2)
      MIXTRAIN_FAIL(kInvalidInput,
                    "CSV file '" << path << "' line " << line_no << ": the header has " << cells.size()
                                 << " column; at least one feature column and a label column are needed",
                    kCsvHint);
    bool all_numeric = true;
    for (const std::string& c : cells) all_numeric = all_numeric && parse_number(c).has_value();
    if (all_numeric)
      MIXTRAIN_FAIL(kInvalidInput,
                    "CSV file '" << path << "' line " << line_no
                                 << " holds numbers where the header row naming the columns is required",
                    "add a first line with column names, e.g. x1,x2,...,label");
    columns = cells;
  }

  void read_row(const std::vector<std::string>& cells, int64_t line_no) {
    if (cells.size() != columns.size())
      MIXTRAIN_FAIL(kInvalidInput,
                    "CSV file '" << path << "' line " << line_no << " has " << cells.size()
                                 << " cells but the header has " << columns.size() << " columns",
                    "every row needs one cell per header column");
    const size_t f = columns.size() - 1;
    for (size_t c = 0; c < f; ++c) {
      const std::optional<double> v = parse_number(cells[c]);
      if (!v) fail_cell(line_no, c, cells[c], "is not a number");
      const float value = static_cast<float>(*v);
      if (!std::isfinite(value)) fail_cell(line_no, c, cells[c], "is not a finite float32 number");
      features.push_back(value);
    }
    const std::optional<double> label = parse_number(cells[f]);
    if (!label) fail_cell(line_no, f, cells[f], "is not a number; labels must be integer class ids");
    if (!std::isfinite(*label) || *label != std::floor(*label))
      fail_cell(line_no, f, cells[f], "is not an integer; labels must be integer class ids");
    if (*label < 0) fail_cell(line_no, f, cells[f], "is negative; labels must be class ids >= 0");
    if (*label >= static_cast<double>(kCsvMaxClasses))
      fail_cell(line_no, f, cells[f], "is too large; labels must be class ids below 65536");
    labels.push_back(static_cast<int32_t>(*label));
  }
};

}  // namespace

Dataset load_csv(const std::string& path) {
  std::string text = read_file(path);
  std::string_view rest(text);
  if (rest.substr(0, 3) == "\xEF\xBB\xBF") rest.remove_prefix(3);  // UTF-8 byte order mark
  if (trim(rest).empty()) MIXTRAIN_FAIL(kInvalidInput, "CSV file '" << path << "' is empty", kCsvHint);

  CsvReader reader{path, {}, {}, {}};
  int64_t line_no = 0;
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view{} : rest.substr(nl + 1);
    ++line_no;
    if (trim(line).empty()) continue;
    const std::vector<std::string> cells = split_cells(line, path, line_no);
    if (reader.columns.empty())
      reader.read_header(cells, line_no);
    else
      reader.read_row(cells, line_no);
  }
  const int64_t n = static_cast<int64_t>(reader.labels.size());
  if (n == 0) MIXTRAIN_FAIL(kInvalidInput, "CSV file '" << path << "' has a header but no data rows", kCsvHint);

  const int64_t f = static_cast<int64_t>(reader.columns.size()) - 1;
  Dataset d;
  d.x = Tensor::empty({n, f}, DType::kFloat32);  // (N, F)
  d.y = Tensor::empty({n}, DType::kInt32);       // (N,)
  std::memcpy(d.x.raw(), reader.features.data(), reader.features.size() * sizeof(float));
  std::memcpy(d.y.raw(), reader.labels.data(), reader.labels.size() * sizeof(int32_t));
  int32_t max_label = 0;
  for (int32_t l : reader.labels) max_label = std::max(max_label, l);
  d.num_classes = max_label + 1;
  d.sample_shape = {f};
  d.source = path;
  return d;
}

DataSplits load_csv_splits(const std::string& path, double holdout_fraction, uint64_t seed) {
  Dataset all = load_csv(path);
  auto [train, test] = split_holdout(all, holdout_fraction, seed);
  return DataSplits{std::move(train), std::move(test), false};
}

}  // namespace mixtrain
