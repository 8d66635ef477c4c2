#include "mixtrain/core/pending_temp_file.h"

#include <unistd.h>

#include <atomic>
#include <cstring>

namespace mixtrain {

namespace {

// A slot is free, being filled (its path not yet whole: a handler skips it) or ready (the handler may unlink it).
enum SlotState : int { kFree = 0, kFilling = 1, kReady = 2 };

struct Slot {
  std::atomic<int> state{kFree};
  char path[4096] = {};
};
static_assert(std::atomic<int>::is_always_lock_free, "a signal handler reads the slots' states");

Slot g_slots[PendingTempFile::kSlots];

}  // namespace

PendingTempFile::PendingTempFile(const std::string& path) noexcept {
  if (path.size() >= sizeof(g_slots[0].path)) return;
  for (int i = 0; i < kSlots; ++i) {
    int expected = kFree;
    if (!g_slots[i].state.compare_exchange_strong(expected, kFilling)) continue;
    std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
    g_slots[i].state.store(kReady);  // seq_cst: the path is whole before a handler can see the slot ready
    slot_ = i;
    return;
  }
}

PendingTempFile::~PendingTempFile() {
  if (slot_ >= 0) g_slots[slot_].state.store(kFree);
}

void remove_pending_temp_files() noexcept {
  for (Slot& s : g_slots)
    if (s.state.load() == kReady) ::unlink(s.path);
}

}  // namespace mixtrain
