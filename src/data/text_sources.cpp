#include "mixtrain/data/text_sources.h"

#include <algorithm>
#include <filesystem>

#include "mixtrain/core/error.h"
#include "mixtrain/data/text.h"

namespace mixtrain {

namespace {

// A directory's regular files (after following links), hidden ones left out, sorted by name.
std::vector<std::string> directory_files(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name[0] == '.' || !entry.is_regular_file(ec)) continue;
    files.push_back(entry.path().string());
  }
  if (ec) MIXTRAIN_FAIL(kIo, "cannot list the directory '" << dir << "': " << ec.message(), "");
  if (files.empty())
    MIXTRAIN_FAIL(kIo, "the directory '" << dir << "' holds no text files", "put .txt files in it, or name the files");
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

std::vector<std::string> text_source_files(const std::string& spec) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(spec, ec)) return {spec};  // also a file whose name holds a comma
  std::vector<std::string> files;
  size_t begin = 0;
  while (begin <= spec.size()) {
    const size_t comma = std::min(spec.find(',', begin), spec.size());
    const std::string item = spec.substr(begin, comma - begin);
    MIXTRAIN_CHECK(!item.empty(), "--data text:" << spec << " has an empty path (between commas, or at an end)");
    if (std::filesystem::is_directory(item, ec)) {
      const std::vector<std::string> inside = directory_files(item);
      files.insert(files.end(), inside.begin(), inside.end());
    } else {
      files.push_back(item);  // read_text_file says what is wrong with it, if anything
    }
    begin = comma + 1;
  }
  return files;
}

std::string read_text_sources(const std::string& spec) {
  const std::vector<std::string> files = text_source_files(spec);
  if (files.size() == 1 && files[0] == spec) return read_text_file(spec);
  std::string text;
  for (const std::string& file : files) {
    const std::string part = read_text_file(file);
    utf8_to_code_points(part, file);
    if (!text.empty() && text.back() != '\n') text.push_back('\n');
    text += part;
    MIXTRAIN_CHECK(static_cast<int64_t>(text.size()) <= kMaxTextBytes,
                   "--data text:" << spec << " holds more than " << kMaxTextBytes
                                  << " bytes in all, the limit for text data sets");
  }
  return text;
}

}  // namespace mixtrain
