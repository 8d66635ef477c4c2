#include "mixtrain/core/file_checks.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "mixtrain/core/error.h"

namespace mixtrain {
namespace {

namespace fs = std::filesystem;

struct ScratchDir {
  fs::path path = fs::temp_directory_path() / ("mixtrain_file_checks_" + std::to_string(::getpid()));
  ScratchDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// The error require_regular_file throws for path; a failure when it throws nothing.
Error refusal(const std::string& path) {
  try {
    require_regular_file(path, "data file");
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "require_regular_file accepted " << path;
  return Error(ErrorKind::kInternal, "", "", "");
}

void expect_refused(const std::string& path, const std::string& detail) {
  const Error e = refusal(path);
  EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
  EXPECT_NE(e.message().find("data file '" + path + "' " + detail), std::string::npos) << e.what();
}

TEST(FileChecks, AcceptsRegularFilesAndLinksToThem) {
  ScratchDir dir;
  const std::string file = (dir.path / "rows.csv").string();
  std::ofstream(file) << "a,label\n1,0\n";
  EXPECT_NO_THROW(require_regular_file(file, "data file"));
  const std::string empty = (dir.path / "empty.csv").string();
  std::ofstream{empty};
  EXPECT_NO_THROW(require_regular_file(empty, "data file"));  // empty is still a file; its reader says what is wrong
  const std::string link = (dir.path / "link.csv").string();
  fs::create_symlink(file, link);
  EXPECT_NO_THROW(require_regular_file(link, "data file"));
}

TEST(FileChecks, RefusesEverythingElseNamingThePath) {
  ScratchDir dir;
  expect_refused((dir.path / "absent.csv").string(), "does not exist");
  expect_refused((dir.path / "absent" / "below.csv").string(), "does not exist");
  expect_refused(dir.path.string(), "is a directory, not a regular file");
  const std::string fifo = (dir.path / "fifo.csv").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_refused(fifo, "is a FIFO (named pipe), not a regular file");  // returns at once: the FIFO is not opened
  expect_refused("/dev/zero", "is a character device, not a regular file");
  const std::string zero = (dir.path / "zero.csv").string();
  fs::create_symlink("/dev/zero", zero);
  expect_refused(zero, "is a character device, not a regular file");
  const std::string dangling = (dir.path / "dangling.csv").string();
  fs::create_symlink(dir.path / "nowhere", dangling);
  expect_refused(dangling, "does not exist");
}

}  // namespace
}  // namespace mixtrain
