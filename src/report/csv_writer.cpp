#include "mixtrain/report/csv_writer.h"

#include <cerrno>
#include <cstring>

#include "mixtrain/core/error.h"
#include "mixtrain/core/file_checks.h"

namespace mixtrain {

std::string csv_escape(const std::string& cell) {
  if (cell.find_first_of(",\"\r\n") == std::string::npos) return cell;
  std::string quoted = "\"";
  for (char c : cell) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + "\"";
}

CsvWriter::CsvWriter(const std::string& path, const std::vector<std::string>& header)
    : path_(path), columns_(header.size()) {
  // Opening a FIFO for writing would wait for a reader forever, and truncating a device would destroy nothing
  // useful to write; only a regular file (or a link to one, which is followed) is written.
  output_file_target(path, "CSV file");
  out_.open(path, std::ios::binary | std::ios::trunc);
  if (!out_) {
    MIXTRAIN_FAIL(kIo, "cannot open CSV file '" << path << "' for writing: " << std::strerror(errno),
                  "check that the directory exists and is writable");
  }
  write_line(header);
}

void CsvWriter::row(const std::vector<std::string>& cells) {
  MIXTRAIN_CHECK(cells.size() == columns_, "CSV row for '" << path_ << "' has " << cells.size()
                                                           << " cells, but the header has " << columns_);
  write_line(cells);
}

void CsvWriter::write_line(const std::vector<std::string>& cells) {
  std::string line;
  for (size_t i = 0; i < cells.size(); ++i) {
    if (i) line += ',';
    line += csv_escape(cells[i]);
  }
  line += "\r\n";
  out_.write(line.data(), static_cast<std::streamsize>(line.size()));
  out_.flush();
  if (!out_) MIXTRAIN_FAIL(kIo, "cannot write to CSV file '" << path_ << "'", "check free disk space");
}

}  // namespace mixtrain
