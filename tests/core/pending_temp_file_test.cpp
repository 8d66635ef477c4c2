// PendingTempFile: what a signal handler removes is exactly the temporary files being written at that moment.
#include "mixtrain/core/pending_temp_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace mixtrain {
namespace {

namespace fs = std::filesystem;

std::string make_file(const fs::path& dir, const std::string& name) {
  const fs::path p = dir / name;
  std::ofstream(p) << "partial";
  return p.string();
}

TEST(PendingTempFile, RemovesTheRecordedFilesAndNoneOnceForgotten) {
  const fs::path dir = fs::temp_directory_path() / ("mixtrain_pending_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string done = make_file(dir, "done.tmp.1"), kept = make_file(dir, "other.tmp.2");
  { const PendingTempFile finished(done); }  // a write that finished: forgotten, so never removed
  std::vector<std::unique_ptr<PendingTempFile>> pending;
  std::vector<std::string> paths;
  for (int i = 0; i < PendingTempFile::kSlots; ++i) {
    paths.push_back(make_file(dir, "ck" + std::to_string(i) + ".tmp.3"));
    pending.push_back(std::make_unique<PendingTempFile>(paths.back()));
    EXPECT_TRUE(pending.back()->recorded());
  }
  const std::string overflow = make_file(dir, "full.tmp.4");
  const PendingTempFile not_recorded(overflow);  // every slot taken
  EXPECT_FALSE(not_recorded.recorded());
  const PendingTempFile too_long(std::string(5000, 'x'));
  EXPECT_FALSE(too_long.recorded());

  remove_pending_temp_files();
  for (const std::string& p : paths) EXPECT_FALSE(fs::exists(p)) << p;
  EXPECT_TRUE(fs::exists(done));
  EXPECT_TRUE(fs::exists(kept));
  EXPECT_TRUE(fs::exists(overflow));
  pending.clear();  // the slots are free again
  const PendingTempFile again(make_file(dir, "again.tmp.5"));
  EXPECT_TRUE(again.recorded());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mixtrain
