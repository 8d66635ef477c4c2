// CSV data sets: a header row naming the columns, numeric features, and the class id in the last column.
#pragma once

#include <cstdint>
#include <string>

#include "mixtrain/data/dataset.h"

namespace mixtrain {

// Labels are class ids, each of which becomes one output unit; a larger id almost always means the last
// column is not a label column.
constexpr int64_t kCsvMaxClasses = 1 << 16;

// Reads a comma-separated file: the first non-blank line is the header (required; a numeric first line is
// rejected, since it would silently lose a sample), every other column but the last is a float feature, and
// the last column holds integer class ids in [0, kCsvMaxClasses). Accepts CRLF line ends, a UTF-8 byte order
// mark, whitespace around cells, double-quoted cells and blank lines. Throws mixtrain::Error naming the file
// and line (and for a bad cell the column name and the cell text) for empty files, header-only files,
// rows with the wrong number of cells, non-numeric or non-finite cells, and non-integer or negative labels.
// Returns x (N, features) float32, y (N,) int32, sample_shape {features}.
Dataset load_csv(const std::string& path);

// load_csv, then holds out holdout_fraction of the rows (seeded by seed) as the test set.
DataSplits load_csv_splits(const std::string& path, double holdout_fraction, uint64_t seed);

}  // namespace mixtrain
