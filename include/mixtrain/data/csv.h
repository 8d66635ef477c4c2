// CSV data sets: numeric features and an integer class id per row, with or without a header row naming the
// columns, plain or gzip-compressed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "mixtrain/data/dataset.h"

namespace mixtrain {

// Labels are class ids, each of which becomes one output unit; a larger id almost always means the last
// column is not a label column.
constexpr int64_t kCsvMaxClasses = 1 << 16;

// Whether the first non-blank line names the columns.
enum class CsvHeader {
  kAuto,  // a header when any of its cells is not a number (pandas' and most public files' layouts both load)
  kYes,   // always a header; a numeric first line is an Error (it would silently lose a sample)
  kNo,    // no header: the first line is data
};
// Parses "auto", "yes" or "no"; Error listing them otherwise.
CsvHeader parse_csv_header(std::string_view text);

struct CsvOptions {
  CsvHeader header = CsvHeader::kAuto;
  // The label column by name (needs a header row); empty: by label_index.
  std::string label_column;
  // The label column by 0-based index; negative counts from the end (-1, the default: the last column).
  int64_t label_index = -1;
};

// Reads a comma-separated file, gzip-compressed or not (recognised by its 1f 8b magic, whatever the name):
// every column but the label column is a float feature (in file order), and the label column holds integer
// class ids in [0, kCsvMaxClasses). Accepts CRLF line ends, a UTF-8 byte order mark, whitespace around cells,
// double-quoted cells and blank lines. Throws mixtrain::Error naming the file and line (and for a bad cell
// the column and the cell text) for empty files, header-only files, rows with the wrong number of cells,
// non-numeric or non-finite cells, non-integer or negative labels, an unknown label column, and damaged gzip
// data. Returns x (N, features) float32, y (N,) int32, sample_shape {features}.
Dataset load_csv(const std::string& path, const CsvOptions& options = {});

// load_csv, then holds out holdout_fraction of the rows (seeded by seed) as the test set.
DataSplits load_csv_splits(const std::string& path, double holdout_fraction, uint64_t seed,
                           const CsvOptions& options = {});

}  // namespace mixtrain
