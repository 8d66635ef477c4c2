#include "mixtrain/core/output_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "mixtrain/core/error.h"
#include "mixtrain/core/file_checks.h"

namespace mixtrain {

namespace {

// The process id written in a lock file, or "an unknown process" when it holds none (written a moment later).
std::string holder_of(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  const std::string text = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  const size_t end = text.find_first_not_of("0123456789");
  const std::string pid = text.substr(0, end);
  return pid.empty() ? "an unknown process" : "process " + pid;
}

// Whether fd is still the file at path: a holder that ended may have removed it after this process opened it.
bool still_at(int fd, const std::string& path) {
  struct stat a = {}, b = {};
  return ::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

}  // namespace

OutputLock::OutputLock(const std::string& path, const char* what) {
  lock_path_ = output_file_target(path, what) + ".lock";
  for (int attempt = 0; attempt < 8; ++attempt) {
    fd_ = ::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd_ < 0)
      MIXTRAIN_FAIL(kIo, what << " " << path << ": cannot create the lock file '" << lock_path_
                              << "': " << std::strerror(errno),
                    "give a path in a writable directory");
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string holder = err == EWOULDBLOCK ? holder_of(fd_) : "";
      ::close(fd_);
      fd_ = -1;
      if (err != EWOULDBLOCK) {  // a file system without locks (ENOLCK, EOPNOTSUPP): the run goes on without
        ::unlink(lock_path_.c_str());
        return;
      }
      MIXTRAIN_FAIL(kInvalidInput, what << " " << path << " is being written by another run (" << holder
                                        << ", which holds " << lock_path_ << ")",
                    "wait for it to end, or give this run another path");
    }
    if (still_at(fd_, lock_path_)) {
      const std::string pid = std::to_string(::getpid()) + "\n";
      // Failing to write the id leaves the lock held; a refused run then names "an unknown process".
      const bool written = ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) > 0;
      (void)written;
      return;
    }
    ::close(fd_);  // removed by its last holder in between: lock the file now at the path
    fd_ = -1;
  }
  MIXTRAIN_FAIL(kIo, what << " " << path << ": the lock file '" << lock_path_ << "' keeps being replaced", "");
}

OutputLock::~OutputLock() {
  if (fd_ < 0) return;
  ::unlink(lock_path_.c_str());  // while still locked, so no run takes a file that is about to go
  ::close(fd_);
}

}  // namespace mixtrain
