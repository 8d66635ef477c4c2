#include "mixtrain/data/csv.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <sstream>
#include <string_view>
#include <vector>

#include <zlib.h>

#include "mixtrain/core/file_checks.h"
#include "mixtrain/core/input_budget.h"
#include "mixtrain/core/input_excerpt.h"

namespace mixtrain {

namespace {

constexpr const char* kCsvHint =
    "expected rows of numeric features with an integer class id (0, 1, ...) in the label column (the last unless "
    "chosen), after an optional header row naming the columns";

std::string_view trim(std::string_view s) {
  const char* ws = " \t\r\n\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// Splits one line at commas. A cell may be double-quoted, with "" standing for one quote inside it.
std::vector<std::string> split_cells(std::string_view line, const std::string& path, int64_t line_no) {
  std::vector<std::string> cells;
  // Sized once (commas + 1 bounds the cells): growing by doubling would hold three times the cells at its peak.
  cells.reserve(static_cast<size_t>(std::count(line.begin(), line.end(), ',')) + 1);
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

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

// The whole file; gzopen inflates gzip streams (1f 8b magic) and passes any other file through unchanged.
std::string read_file(const std::string& path) {
  require_regular_file(path, "CSV file");
  std::unique_ptr<gzFile_s, GzCloser> f(gzopen(path.c_str(), "rb"));
  if (!f) MIXTRAIN_FAIL(kIo, "cannot open CSV file '" << path << "': " << std::strerror(errno), "check permissions");
  std::string out;
  std::vector<char> chunk(1 << 16);
  // A gzip expands up to 1032 times: the text is held to the input budget as it arrives, not after.
  const int64_t budget = input_budget();
  for (;;) {
    const int got = gzread(f.get(), chunk.data(), static_cast<unsigned>(chunk.size()));
    if (got < 0) {
      int code = 0;
      const char* why = gzerror(f.get(), &code);
      MIXTRAIN_FAIL(kInvalidInput, "CSV file '" << path << "': cannot decompress its gzip data (" << why << ")",
                    "the file starts like gzip but is damaged or truncated; download it again or pass it "
                    "uncompressed");
    }
    if (got == 0) break;
    if (static_cast<int64_t>(out.size()) + got > budget)
      check_input_budget(path, "its text (decompressed)", static_cast<int64_t>(out.size()) + got);
    out.append(chunk.data(), static_cast<size_t>(got));
  }
  // zlib ends a truncated gzip stream like a complete one and reports it only here (Z_BUF_ERROR).
  int code = Z_OK;
  const char* why = gzerror(f.get(), &code);
  if (code != Z_OK)
    MIXTRAIN_FAIL(kInvalidInput, "CSV file '" << path << "': cannot decompress its gzip data (" << why << ")",
                  "the gzip stream is truncated or damaged; download the file again or pass it uncompressed");
  return out;
}

struct CsvReader {
  const std::string& path;
  const CsvOptions& options;
  std::vector<std::string> columns;  // names; empty strings without a header
  bool has_header = false;
  size_t label = 0;                  // the label column's index
  std::vector<float> features;       // (N * F) row-major
  std::vector<int32_t> labels;       // (N,)
  int64_t text_bytes = 0;            // the file's text, held while the rows are read
  int64_t budget = input_budget();

  // Before a line of `cells` cells is split: its cells as strings, and the rows so far with it as float32 (twice:
  // the reader's and the data set's copy) beside the text, must fit the input budget.
  void charge(int64_t line_no, int64_t cells) const {
    const int64_t line = cells * static_cast<int64_t>(sizeof(std::string) + sizeof(float));
    if (line > budget)
      check_input_budget(path, "line " + std::to_string(line_no) + "'s " + std::to_string(cells) + " cells", line);
    const int64_t rows = 2 * static_cast<int64_t>((features.size() + labels.size()) * sizeof(float)) + line;
    if (text_bytes + rows > budget)
      check_input_budget(path, "its text and " + std::to_string(labels.size() + 1) + " rows of " +
                                   std::to_string(columns.empty() ? cells : static_cast<int64_t>(columns.size())) +
                                   " columns",
                         text_bytes + rows);
  }

  std::string column_label(size_t c) const {
    return "column " + std::to_string(c + 1) + (columns[c].empty() ? "" : " '" + input_excerpt(columns[c]) + "'");
  }

  [[noreturn]] void fail_cell(int64_t line_no, size_t c, const std::string& cell, const char* problem) const {
    MIXTRAIN_FAIL(
        kInvalidInput,
        "CSV file '" << path << "' line " << line_no << ", " << column_label(c) << ": '" << input_excerpt(cell) << "' " << problem,
        c == label ? "the label column must hold integer class ids 0, 1, ... (map class names to ids first, or "
                     "choose another label column)"
                   : kCsvHint);
  }

  // The first non-blank line: a header or the first row, as options.header says.
  void read_first(const std::vector<std::string>& cells, int64_t line_no) {
    bool all_numeric = true;
    for (const std::string& c : cells) all_numeric = all_numeric && parse_number(c).has_value();
    has_header = options.header == CsvHeader::kYes || (options.header == CsvHeader::kAuto && !all_numeric);
    if (options.header == CsvHeader::kYes && all_numeric)
      MIXTRAIN_FAIL(kInvalidInput,
                    "CSV file '" << path << "' line " << line_no
                                 << " holds numbers where the header row naming the columns is required",
                    "add a first line with column names, e.g. x1,x2,...,label, or read the file as headerless "
                    "(--csv-header no or auto; CsvOptions::header = CsvHeader::kNo or kAuto)");
    if (cells.size() < 2)
      MIXTRAIN_FAIL(kInvalidInput,
                    "CSV file '" << path << "' line " << line_no << ": the " << (has_header ? "header" : "first row")
                                 << " has " << cells.size()
                                 << " column; at least one feature column and a label column are needed",
                    kCsvHint);
    columns = has_header ? cells : std::vector<std::string>(cells.size());
    resolve_label(line_no);
    if (!has_header) read_row(cells, line_no);
  }

  void resolve_label(int64_t line_no) {
    const int64_t n = static_cast<int64_t>(columns.size());
    if (!options.label_column.empty()) {
      if (!has_header)
        MIXTRAIN_FAIL(kInvalidInput,
                      "CSV file '" << path << "': label column '" << options.label_column
                                   << "' is chosen by name, but the file has no header row naming its columns",
                      "choose the label column by index (--label-column 0, 1, ... or -1 for the last; CsvOptions::label_index), "
                      "or add a header row");
      auto it = std::find(columns.begin(), columns.end(), options.label_column);
      if (it == columns.end()) {
        std::string names;
        for (const std::string& c : columns) names += (names.empty() ? "" : ", ") + input_excerpt(c);
        names = input_excerpt(names, 400);
        MIXTRAIN_FAIL(kInvalidInput,
                      "CSV file '" << path << "' line " << line_no << ": no column is named '" << options.label_column
                                   << "'; the header names " << names,
                      "pass one of the header's names as the label column (--label-column NAME; CsvOptions::label_column)");
      }
      label = static_cast<size_t>(it - columns.begin());
      return;
    }
    const int64_t i = options.label_index < 0 ? n + options.label_index : options.label_index;
    if (i < 0 || i >= n)
      MIXTRAIN_FAIL(kInvalidInput,
                    "CSV file '" << path << "': label column index " << options.label_index << " is outside the "
                                 << n << " columns",
                    "use 0 .. " + std::to_string(n - 1) + ", or -1 for the last column");
    label = static_cast<size_t>(i);
  }

  void read_row(const std::vector<std::string>& cells, int64_t line_no) {
    if (cells.size() != columns.size())
      MIXTRAIN_FAIL(kInvalidInput,
                    "CSV file '" << path << "' line " << line_no << " has " << cells.size() << " cells but the "
                                 << (has_header ? "header has " : "first row has ") << columns.size()
                                 << (has_header ? " columns" : " cells"),
                    "every row needs one cell per column");
    for (size_t c = 0; c < columns.size(); ++c) {
      if (c == label) continue;
      const std::optional<double> v = parse_number(cells[c]);
      if (!v) fail_cell(line_no, c, cells[c], "is not a number");
      const float value = static_cast<float>(*v);
      if (!std::isfinite(value)) fail_cell(line_no, c, cells[c], "is not a finite float32 number");
      features.push_back(value);
    }
    const std::string& cell = cells[label];
    const std::optional<double> v = parse_number(cell);
    if (!v) fail_cell(line_no, label, cell, "is not a number; labels must be integer class ids");
    if (!std::isfinite(*v) || *v != std::floor(*v))
      fail_cell(line_no, label, cell, "is not an integer; labels must be integer class ids");
    if (*v < 0) fail_cell(line_no, label, cell, "is negative; labels must be class ids >= 0");
    if (*v >= static_cast<double>(kCsvMaxClasses))
      fail_cell(line_no, label, cell, "is too large; labels must be class ids below 65536");
    labels.push_back(static_cast<int32_t>(*v));
  }
};

}  // namespace

CsvHeader parse_csv_header(std::string_view text) {
  if (text == "auto") return CsvHeader::kAuto;
  if (text == "yes") return CsvHeader::kYes;
  if (text == "no") return CsvHeader::kNo;
  MIXTRAIN_FAIL(kInvalidInput, "CSV header option '" << text << "' is not one of auto, yes, no",
                "auto: a header when the first line is not all numbers; yes: always; no: never");
}

Dataset load_csv(const std::string& path, const CsvOptions& options) {
  std::string text = read_file(path);
  std::string_view rest(text);
  if (rest.substr(0, 3) == "\xEF\xBB\xBF") rest.remove_prefix(3);  // UTF-8 byte order mark
  if (trim(rest).empty()) MIXTRAIN_FAIL(kInvalidInput, "CSV file '" << path << "' is empty", kCsvHint);

  CsvReader reader{path, options, {}, false, 0, {}, {}, static_cast<int64_t>(text.size()), input_budget()};
  int64_t line_no = 0;
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view{} : rest.substr(nl + 1);
    ++line_no;
    if (trim(line).empty()) continue;
    reader.charge(line_no, static_cast<int64_t>(std::count(line.begin(), line.end(), ',')) + 1);
    const std::vector<std::string> cells = split_cells(line, path, line_no);
    if (reader.columns.empty())
      reader.read_first(cells, line_no);
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

DataSplits load_csv_splits(const std::string& path, double holdout_fraction, uint64_t seed,
                           const CsvOptions& options) {
  Dataset all = load_csv(path, options);
  auto [train, test] = split_holdout(all, holdout_fraction, seed);
  return DataSplits{std::move(train), std::move(test), false};
}

}  // namespace mixtrain
