// CsvWriter: appends rows to an RFC 4180 CSV file (the per-epoch log a Keras CSVLogger writes).
// Each row is flushed at once so a crashed or interrupted run still leaves every finished epoch on disk.
#pragma once

#include <fstream>
#include <string>
#include <vector>

namespace mixtrain {

// Quotes a cell only when RFC 4180 requires it (comma, double quote, CR or LF), doubling inner quotes;
// the same output as Python's csv module with QUOTE_MINIMAL.
std::string csv_escape(const std::string& cell);

class CsvWriter {
 public:
  // Creates (truncates) path and writes the header row. Throws mixtrain::Error (kIo) naming the path
  // when the file cannot be opened.
  CsvWriter(const std::string& path, const std::vector<std::string>& header);

  // Writes one row, terminated by CRLF as RFC 4180 specifies, and flushes it. Throws mixtrain::Error:
  // kInvalidInput when the cell count differs from the header's, kIo when the write fails.
  void row(const std::vector<std::string>& cells);

  const std::string& path() const { return path_; }

 private:
  void write_line(const std::vector<std::string>& cells);

  std::string path_;
  size_t columns_;
  std::ofstream out_;
};

}  // namespace mixtrain
