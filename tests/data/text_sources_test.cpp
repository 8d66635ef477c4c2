// --data text:SPEC with a directory or several files: which files, in which order, joined how.
#include "mixtrain/data/text_sources.h"

#include <gtest/gtest.h>

#include "test_files.h"

namespace mixtrain {
namespace {

using testing::contains;
using testing::error_of;
using testing::TempDir;
using testing::write_text;

TEST(TextSources, ADirectoryIsItsVisibleFilesInNameOrder) {
  TempDir dir;
  const std::string d = dir.path().string();
  write_text(d + "/b.txt", "second\n");
  write_text(d + "/a.txt", "first");  // no final newline: one is put between it and the next file
  write_text(d + "/.hidden", "never");
  std::filesystem::create_directory(d + "/sub");
  write_text(d + "/sub/c.txt", "nor this");
  EXPECT_EQ(text_source_files(d), (std::vector<std::string>{d + "/a.txt", d + "/b.txt"}));
  EXPECT_EQ(read_text_sources(d), "first\nsecond\n");
  // Several, separated by commas, in the order given; a directory among them expands in place.
  write_text(d + "/sub/d.txt", "fourth");
  EXPECT_EQ(read_text_sources(d + "/b.txt," + d + "/sub," + d + "/a.txt"), "second\nnor this\nfourth\nfirst");
  // One file reads exactly as it is, with or without a final newline.
  EXPECT_EQ(read_text_sources(d + "/a.txt"), "first");
}

TEST(TextSources, SayWhichFileIsWrong) {
  TempDir dir;
  const std::string d = dir.path().string();
  std::filesystem::create_directory(d + "/empty");
  write_text(d + "/ok.txt", "fine\n");
  write_text(d + "/bad.txt", "ab\xFF");
  const Error empty = error_of([&] { read_text_sources(d + "/empty"); });
  EXPECT_EQ(empty.kind(), ErrorKind::kIo);
  EXPECT_TRUE(contains(empty.message(), "holds no text files")) << empty.message();
  EXPECT_TRUE(contains(error_of([&] { read_text_sources(d + "/ok.txt,"); }).message(), "has an empty path"));
  const std::string bad = error_of([&] { read_text_sources(d + "/ok.txt," + d + "/bad.txt"); }).message();
  EXPECT_TRUE(contains(bad, "bad.txt' is not UTF-8 text: byte 2")) << bad;
  EXPECT_TRUE(contains(error_of([&] { read_text_sources(d + "/ok.txt," + d + "/gone.txt"); }).message(), "gone.txt"));
}

}  // namespace
}  // namespace mixtrain
