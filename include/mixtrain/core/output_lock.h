// An advisory lock (flock(2)) that a run holds on an output it writes again and again (a checkpoint), so that a
// second process writing the same path is refused instead of the two replacing each other's files in turn.
#pragma once

#include <string>

namespace mixtrain {

class OutputLock {
 public:
  // Locks "<target>.lock" beside the file path names (after its symbolic links, as output_file_target), writing
  // this process's id into it. Throws Error (kInvalidInput) naming the path and the holder's process id when
  // another process holds it; kIo when the lock file cannot be made. The lock ends with the object or the process
  // (also when killed), and the lock file is removed then, except after a kill (a later run takes it over). On a
  // file system that cannot lock, nothing is held.
  OutputLock(const std::string& path, const char* what);
  ~OutputLock();
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;
  const std::string& lock_path() const { return lock_path_; }

 private:
  std::string lock_path_;
  int fd_ = -1;
};

}  // namespace mixtrain
