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

// The file an output named path is written to, checked so that writing it destroys nothing but an earlier output:
// a symbolic link is followed (the file it points to is written and the link is kept; a writer that renames a
// temporary file over path would otherwise replace the link itself), and a target that exists but is not a regular
// file (a directory, a FIFO, a device node such as /dev/null) is refused, since replacing or truncating it would
// destroy it. Throws mixtrain::Error (kIo) whose message starts with what and the path: "--save 'x' is a FIFO
// (named pipe), not a regular file". An absent path is returned as is; whether its directory is writable is the
// writer's to report.
std::string output_file_target(const std::string& path, const char* what);

// Whether a and b name the same file: the same device and inode when both exist (links, hard links and different
// spellings of one path agree), otherwise the same absolute path once symbolic links are followed.
bool same_file(const std::string& a, const std::string& b);

}  // namespace mixtrain
