// Command-line flags: "--name value" or "--name=value". Every lookup names the flag in its error,
// and unknown flags are refused with the list of valid ones.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "mixtrain/core/device.h"

namespace mixtrain::cli {

struct IntRange {
  int64_t min;
  int64_t max;
};

// The values an integer flag accepts: --epochs, --batch-size, --steps and list items such as --hidden's from 1 to
// INT32_MAX (they become ints or sizes), --seed from 0 to INT64_MAX; any other integer flag the range of an int
// (INT32_MIN to INT32_MAX), so a value a caller stores in an int is never truncated.
IntRange integer_range(const std::string& name);

// Thrown by Args for --help or -h where a flag may stand (not as a flag's value): main prints the usage, exit 0.
struct HelpRequested {};

// Whether an argument asks for the usage.
inline bool is_help(const std::string& arg) { return arg == "--help" || arg == "-h"; }

class Args {
 public:
  // argv after the subcommand. flags: accepted names (without "--"); switches: flags that take no value.
  // --help or -h in a flag's place throws HelpRequested, whatever else is on the line.
  Args(const std::vector<std::string>& argv, const std::set<std::string>& flags,
       const std::set<std::string>& switches = {});
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string str(const std::string& name, const std::string& fallback) const;
  // A switch written as a value, `--NAME on|off`: anything else is refused naming the flag.
  bool on_off(const std::string& name, bool fallback) const;
  // A path flag's value; "" when the flag is absent. An empty value is refused naming the flag (`--save ''` once
  // meant "no --save", so a run whose path variable was unset trained without saving).
  std::string path(const std::string& name) const;
  // The flag's value parsed as a 64-bit integer, then checked against [min, max]: a value outside (even one past
  // int64) is refused with an error naming the flag and the range, never truncated. The fallback is not checked.
  int64_t integer(const std::string& name, int64_t fallback, int64_t min, int64_t max) const;
  // As above with the flag's range from integer_range(name).
  int64_t integer(const std::string& name, int64_t fallback) const;
  double number(const std::string& name, double fallback) const;
  // Comma-separated positive integers, e.g. "256,128", each at most integer_range(name).max.
  std::vector<int64_t> int_list(const std::string& name, const std::vector<int64_t>& fallback) const;
  std::vector<std::string> str_list(const std::string& name, const std::vector<std::string>& fallback) const;

 private:
  std::map<std::string, std::string> values_;
};

// device_flag.cpp: --device cpu|cuda|cuda:N (default cpu), the flag named in the error of a malformed value.
Device device_flag(const Args& a);
// The same, for a command that trains or runs a model there: a GPU this machine cannot use (no CUDA backend in
// the build, no driver or GPU, an index past the last GPU) is refused now, before any data is loaded.
Device usable_device_flag(const Args& a, const char* command);

}  // namespace mixtrain::cli
