#include "mixtrain/core/file_checks.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

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

}  // namespace mixtrain
