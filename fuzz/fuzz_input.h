// What every fuzz target shares: the input written to a file (the readers take paths, and the path is part of
// what they check), and the rule for the outcome of reading it.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "mixtrain/core/error.h"

namespace mixtrain::fuzz {

// One file per process under $TMPDIR (scripts/fuzz.sh gives each run its own), rewritten for every input and
// removed at exit. The name carries the extension a reader might look at.
class InputFile {
 public:
  explicit InputFile(const std::string& name) {
    const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                      ("mixtrain-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    dir_ = dir.string();
    path_ = (dir / name).string();
  }
  ~InputFile() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  // Replaces the file's contents with data; aborts if it cannot (a full disk must not pass for a finding).
  const std::string& write(const uint8_t* data, size_t size) {
    // A new file each time rather than a truncated one: ext4 flushes a file rewritten through truncation to disk
    // when it is closed (auto_da_alloc), which costs milliseconds per input.
    std::remove(path_.c_str());
    std::ofstream out(path_, std::ios::binary);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    out.close();
    if (!out) {
      std::fprintf(stderr, "fuzz: cannot write the input to %s\n", path_.c_str());
      std::abort();
    }
    return path_;
  }

 private:
  std::string dir_;
  std::string path_;
};

// Runs a reader on hostile input. Refusing it with mixtrain::Error of kind kInvalidInput or kIo (exit status 2
// in the CLI) is the expected outcome; kInternal (exit 1, "a bug") is a finding, and so is any other exception,
// which escapes to libFuzzer. Crashes, sanitizer reports, hangs and oversized allocations are caught by
// libFuzzer and the sanitizers themselves.
template <typename Fn>
void refuse_or_accept(Fn&& read) {
  try {
    read();
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kInternal) {
      std::fprintf(stderr, "fuzz: bad input reported as an internal error: %s\n", e.what());
      std::abort();
    }
  }
}

// Library warnings (e.g. a checkpoint without checksums) would print once per input; the sanitizers and libFuzzer
// report through stderr's file descriptor, not std::cerr, so silencing the stream hides nothing that matters.
inline void silence_library_warnings() { std::cerr.rdbuf(nullptr); }

}  // namespace mixtrain::fuzz
