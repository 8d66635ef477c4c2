// SIGTERM, SIGINT and SIGHUP during `mixtrain train`: the first asks the run to stop after the step in progress
// (a StopRequest that fit() polls), so the checkpoint is written and the run resumes bit-identically; a second
// one ends the process at once, after removing the temporary file of a save in progress.
#pragma once

#include <string>

#include "mixtrain/train/stop_request.h"

namespace mixtrain::cli {

// Installs the handlers (sigaction) for the process; `stop` must outlive them (the CLI's lives to the exit).
void install_stop_signals(StopRequest& stop);
// After the run's last look at its StopRequest: later signals are ignored (the process is about to exit with the
// status it chose, and a line saying it stops would be wrong).
void close_stop_signals();
// The shell's status for a process ended by `signal`: 128 + its number (143 for SIGTERM, 130 SIGINT, 129 SIGHUP).
int exit_status_for_signal(int signal);
// "SIGTERM", "SIGINT", "SIGHUP", or "signal N".
std::string signal_name(int signal);

}  // namespace mixtrain::cli
