// Command-line flags: "--name value" or "--name=value". Every lookup names the flag in its error,
// and unknown flags are refused with the list of valid ones.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace mixtrain::cli {

class Args {
 public:
  // argv after the subcommand. flags: accepted names (without "--"); switches: flags that take no value.
  Args(const std::vector<std::string>& argv, const std::set<std::string>& flags,
       const std::set<std::string>& switches = {});
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string str(const std::string& name, const std::string& fallback) const;
  int64_t integer(const std::string& name, int64_t fallback) const;
  double number(const std::string& name, double fallback) const;
  // Comma-separated positive integers, e.g. "256,128".
  std::vector<int64_t> int_list(const std::string& name, const std::vector<int64_t>& fallback) const;
  std::vector<std::string> str_list(const std::string& name, const std::vector<std::string>& fallback) const;

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace mixtrain::cli
