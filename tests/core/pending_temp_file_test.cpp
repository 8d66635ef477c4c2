// PendingTempFile: what a signal handler removes is exactly the temporary files being written at that moment;
// OutputLock: one writer per output.
#include "mixtrain/core/pending_temp_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/error.h"
#include "mixtrain/core/output_lock.h"

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

namespace mixtrain {
namespace {

// OutputLock: a second lock on one output is refused naming the holder's process; the lock file goes with the lock.
TEST(OutputLock, ASecondWriterIsRefusedNamingTheHolder) {
  const fs::path dir = fs::temp_directory_path() / ("mixtrain_lock_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string ckpt = (dir / "ck.safetensors").string();
  {
    const OutputLock first(ckpt, "--save");
    EXPECT_EQ(first.lock_path(), ckpt + ".lock");
    std::ifstream in(first.lock_path());
    std::string pid;
    in >> pid;
    EXPECT_EQ(pid, std::to_string(::getpid()));
    try {
      const OutputLock second(ckpt, "--save");
      ADD_FAILURE() << "a second lock on one path was taken";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_NE(std::string(e.what()).find("is being written by another run (process " + pid), std::string::npos)
          << e.what();
    }
  }
  EXPECT_FALSE(fs::exists(ckpt + ".lock"));
  { const OutputLock again(ckpt, "--save"); }  // free once the first ended
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mixtrain
