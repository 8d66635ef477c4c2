#include "mixtrain/report/csv_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "mixtrain/core/error.h"

namespace mixtrain {
namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(CsvEscape, QuotesOnlyWhenRequired) {
  EXPECT_EQ(csv_escape("plain"), "plain");
  EXPECT_EQ(csv_escape(""), "");
  EXPECT_EQ(csv_escape(" spaced "), " spaced ");
  EXPECT_EQ(csv_escape("0.5123"), "0.5123");
  EXPECT_EQ(csv_escape("a,b"), "\"a,b\"");
  EXPECT_EQ(csv_escape("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(csv_escape("\""), "\"\"\"\"");
  EXPECT_EQ(csv_escape("line\nbreak"), "\"line\nbreak\"");
  EXPECT_EQ(csv_escape("cr\r"), "\"cr\r\"");
}

TEST(CsvWriter, WritesQuotedRowsAndFlushesEachOne) {
  const std::string path = (fs::temp_directory_path() / ("mixtrain_csv_" + std::to_string(::getpid()) + ".csv")).string();
  {
    CsvWriter csv(path, {"epoch", "loss", "note"});
    EXPECT_EQ(csv.path(), path);
    EXPECT_EQ(read_file(path), "epoch,loss,note\r\n");
    csv.row({"0", "0.5", "plain"});
    csv.row({"1", "0.25", "a,b"});
    // Flushed: readable while the writer is still open.
    EXPECT_EQ(read_file(path), "epoch,loss,note\r\n0,0.5,plain\r\n1,0.25,\"a,b\"\r\n");
    csv.row({"2", "0.1", "say \"hi\""});
    csv.row({"3", "", "line\nbreak"});
    try {
      csv.row({"4", "0.1"});
      FAIL();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_NE(e.message().find("2 cells, but the header has 3"), std::string::npos);
    }
  }
  EXPECT_EQ(read_file(path),
            "epoch,loss,note\r\n0,0.5,plain\r\n1,0.25,\"a,b\"\r\n2,0.1,\"say \"\"hi\"\"\"\r\n3,,\"line\nbreak\"\r\n");
  // A second writer truncates.
  { CsvWriter again(path, {"x"}); }
  EXPECT_EQ(read_file(path), "x\r\n");
  fs::remove(path);
}

TEST(CsvWriter, UnopenablePathIsAnIoErrorNamingThePath) {
  const std::string path = "/nonexistent_mixtrain_dir/history.csv";
  try {
    CsvWriter csv(path, {"epoch"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(e.message().find(path), std::string::npos);
    EXPECT_NE(e.message().find("No such file or directory"), std::string::npos);
  }
}

}  // namespace
}  // namespace mixtrain
