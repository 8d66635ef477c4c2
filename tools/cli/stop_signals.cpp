#include "stop_signals.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>

#include "mixtrain/core/pending_temp_file.h"

namespace mixtrain::cli {

namespace {

constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGHUP};
StopRequest* g_stop = nullptr;  // set before the handlers are installed, never changed after
std::atomic<bool> g_closed{false};
static_assert(std::atomic<bool>::is_always_lock_free, "a signal handler reads it");

void write_stderr(const char* text) {
  const ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

// Only async-signal-safe calls: an atomic store, write(2), unlink(2), sigaction(2), raise(3).
void on_stop_signal(int sig) {
  if (g_closed.load()) return;
  const int saved_errno = errno;
  if (g_stop->requested()) {
    // The second signal: nothing more is waited for. A save in progress leaves its temporary file half written;
    // removing it keeps the last complete checkpoint the only file at that path.
    remove_pending_temp_files();
    struct sigaction dfl = {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(sig, &dfl, nullptr);
    ::raise(sig);  // delivered when this handler returns (sig is blocked in it): the process ends by the signal
  } else {
    g_stop->request(sig);
    write_stderr("mixtrain: stopping after the current step, then saving the checkpoint (send the signal again to "
                 "stop at once)\n");
  }
  errno = saved_errno;
}

}  // namespace

void install_stop_signals(StopRequest& stop) {
  g_stop = &stop;
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // While one of them is handled the others wait, so a SIGINT landing inside the SIGTERM handler is the second.
  for (int sig : kStopSignals) sigaddset(&sa.sa_mask, sig);
  sa.sa_flags = SA_RESTART;  // reads and writes in progress go on rather than fail with EINTR
  for (int sig : kStopSignals) {
    // A signal the process was started with ignored stays ignored: `nohup` (SIGHUP) or a job a shell put in
    // the background (SIGINT) asked for that.
    struct sigaction old = {};
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    ::sigaction(sig, &sa, nullptr);
  }
}

void close_stop_signals() { g_closed.store(true); }

int exit_status_for_signal(int signal) { return 128 + signal; }

std::string signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    default: return "signal " + std::to_string(signal);
  }
}

}  // namespace mixtrain::cli
