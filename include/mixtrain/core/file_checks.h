// Checks on paths a user hands in as data, shared by every reader so the rules and messages are the same.
#pragma once

#include <string>

namespace mixtrain {

// Requires path to name a regular file (after following symbolic links) before a reader opens it: a FIFO would
// block the open forever, a device such as /dev/zero reads without end, a directory holds no data. what says what
// the caller reads, e.g. "CSV file" or "IDX file", and starts the message: "CSV file 'x.csv' is a FIFO (named
// pipe), not a regular file". Throws mixtrain::Error (kIo, which the CLI reports with exit status 2) when the path
// does not exist, cannot be examined, or is not a regular file.
void require_regular_file(const std::string& path, const char* what);

}  // namespace mixtrain
