// The temporary file of a write in progress (a save's "<path>.tmp.<pid>"), recorded where a signal handler can find
// it: remove_pending_temp_files() unlinks every recorded one and is async-signal-safe, so a process that a signal
// ends in the middle of a save leaves no temporary file behind (the CLI calls it on a second SIGTERM or SIGINT).
#pragma once

#include <string>

namespace mixtrain {

class PendingTempFile {
 public:
  // Records path until destruction. Records nothing when every slot is taken (kSlots writes at once) or the path
  // is longer than the slot (such a file is left to the next save's removal of stale temporary files).
  explicit PendingTempFile(const std::string& path) noexcept;
  ~PendingTempFile();
  PendingTempFile(const PendingTempFile&) = delete;
  PendingTempFile& operator=(const PendingTempFile&) = delete;
  bool recorded() const { return slot_ >= 0; }

  static constexpr int kSlots = 4;

 private:
  int slot_ = -1;
};

// Unlinks every recorded temporary file. Async-signal-safe: only atomic loads and unlink(2).
void remove_pending_temp_files() noexcept;

}  // namespace mixtrain
