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

// Outputs: a link is followed to the file it points to (kept, relative or absolute, dangling included); a FIFO,
// device or directory, directly or at the end of links, is refused naming the path.
TEST(FileChecks, OutputTargetsFollowLinksAndRefuseWhatWritingWouldDestroy) {
  ScratchDir dir;
  const std::string file = (dir.path / "out.json").string();
  EXPECT_EQ(output_file_target(file, "--json"), file);  // absent: created
  std::ofstream(file) << "{}";
  EXPECT_EQ(output_file_target(file, "--json"), file);
  fs::create_symlink("out.json", dir.path / "rel.json");
  EXPECT_EQ(output_file_target((dir.path / "rel.json").string(), "--json"), file);
  fs::create_symlink(dir.path / "rel.json", dir.path / "chain.json");
  EXPECT_EQ(output_file_target((dir.path / "chain.json").string(), "--json"), file);
  fs::create_symlink("new.json", dir.path / "dangling.json");
  EXPECT_EQ(output_file_target((dir.path / "dangling.json").string(), "--json"), (dir.path / "new.json").string());
  const std::string fifo = (dir.path / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_symlink("/dev/null", dir.path / "null.json");
  const std::pair<std::string, std::string> refused[] = {
      {fifo, "'" + fifo + "' is a FIFO (named pipe), not a regular file"},
      {"/dev/null", "'/dev/null' is a character device, not a regular file"},
      {dir.path.string(), "'" + dir.path.string() + "' is a directory, not a regular file"},
      {(dir.path / "null.json").string(),
       "'" + (dir.path / "null.json").string() + "' links to '/dev/null', which is a character device"}};
  for (const auto& [path, detail] : refused) {
    try {
      output_file_target(path, "--save");
      ADD_FAILURE() << "accepted " << path;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kIo);
      EXPECT_NE(e.message().find("--save " + detail), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(fs::is_fifo(fifo));
}

TEST(FileChecks, SameFileSeesThroughLinksAndSpellings) {
  ScratchDir dir;
  const std::string a = (dir.path / "a.csv").string();
  std::ofstream(a) << "x";
  fs::create_symlink(a, dir.path / "link.csv");
  fs::create_hard_link(a, dir.path / "hard.csv");
  std::ofstream((dir.path / "b.csv").string()) << "x";
  EXPECT_TRUE(same_file(a, (dir.path / "link.csv").string()));
  EXPECT_TRUE(same_file(a, (dir.path / "hard.csv").string()));
  EXPECT_TRUE(same_file(a, (dir.path / "." / "a.csv").string()));
  EXPECT_FALSE(same_file(a, (dir.path / "b.csv").string()));
  EXPECT_TRUE(same_file((dir.path / "new.json").string(), (dir.path / "sub" / ".." / "new.json").string()));
  EXPECT_FALSE(same_file((dir.path / "new.json").string(), (dir.path / "other.json").string()));
  EXPECT_FALSE(same_file(a, (dir.path / "new.json").string()));
}

}  // namespace
}  // namespace mixtrain
