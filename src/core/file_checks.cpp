#include "mixtrain/core/file_checks.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "mixtrain/core/error.h"

namespace mixtrain {

namespace {

// What a non-regular file is, in the words of stat(2)'s file types.
const char* file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file of a known type";
}

}  // namespace

void require_regular_file(const std::string& path, const char* what) {
  struct stat st;
  // stat, not lstat: a symbolic link to a regular file is fine, one to /dev/zero is not.
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR)
      MIXTRAIN_FAIL(kIo, what << " '" << path << "' does not exist", "check the path");
    MIXTRAIN_FAIL(kIo, "cannot examine " << what << " '" << path << "': " << std::strerror(err),
                  "check the path and its permissions");
  }
  if (!S_ISREG(st.st_mode)) {
    MIXTRAIN_FAIL(kIo, what << " '" << path << "' is " << file_type_name(st.st_mode) << ", not a regular file",
                  "data is read only from regular files; copy the data into a file and pass that");
  }
}

std::string output_file_target(const std::string& path, const char* what) {
  namespace fs = std::filesystem;
  fs::path p = path;
  // 40 is the kernel's own limit on links followed while resolving one path (ELOOP).
  for (int hops = 0; hops < 40; ++hops) {
    struct stat st;
    // Absent (or not examinable): nothing is there to destroy; the writer reports a directory it cannot write.
    if (::lstat(p.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return p.string();
    if (!S_ISLNK(st.st_mode)) {
      const std::string via = p.string() == path ? "" : "links to '" + p.string() + "', which ";
      MIXTRAIN_FAIL(kIo, what << " '" << path << "' " << via << "is " << file_type_name(st.st_mode)
                              << ", not a regular file; writing would replace it",
                    "give the path of a regular file, or of a file to create");
    }
    std::error_code ec;
    const fs::path target = fs::read_symlink(p, ec);
    if (ec) return p.string();
    p = target.is_absolute() ? target : p.parent_path() / target;
  }
  MIXTRAIN_FAIL(kIo, what << " '" << path << "' is a chain of more than 40 symbolic links", "give a file path");
}

bool same_file(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  struct stat sa, sb;
  const bool has_a = ::stat(a.c_str(), &sa) == 0, has_b = ::stat(b.c_str(), &sb) == 0;
  if (has_a && has_b) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  if (has_a != has_b) return false;
  std::error_code ea, eb;
  const fs::path ca = fs::weakly_canonical(fs::absolute(a), ea), cb = fs::weakly_canonical(fs::absolute(b), eb);
  return !ea && !eb && ca == cb;
}

}  // namespace mixtrain
