// Where a language model's text comes from: `--data text:SPEC` names one file, a directory, or several of either.
#pragma once

#include <string>
#include <vector>

namespace mixtrain {

// The files SPEC names, in order: a file itself; a directory's regular files (not its subdirectories, nor names
// starting with '.') sorted by name; several of either separated by commas. Error (kIo) when one is missing, or a
// directory holds no file.
std::vector<std::string> text_source_files(const std::string& spec);
// The text of those files joined in that order, with a newline between two files where the first does not end in
// one, at most kMaxTextBytes (data/text.h) in all. One file reads exactly as read_text_file; with several, each is
// checked to be UTF-8 on its own, so an error names the file and its own byte offset.
std::string read_text_sources(const std::string& spec);

}  // namespace mixtrain
