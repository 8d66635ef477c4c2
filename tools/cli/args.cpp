#include "args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "mixtrain/core/error.h"

namespace mixtrain::cli {

namespace {
std::string valid_list(const std::set<std::string>& flags, const std::set<std::string>& switches) {
  std::string s;
  for (const auto& f : flags) s += (s.empty() ? "--" : ", --") + f;
  for (const auto& f : switches) s += (s.empty() ? "--" : ", --") + f;
  return s;
}
}  // namespace

Args::Args(const std::vector<std::string>& argv, const std::set<std::string>& flags,
           const std::set<std::string>& switches) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) != 0)
      MIXTRAIN_FAIL(kInvalidInput, "unexpected argument '" << a << "'", "flags look like --name value");
    std::string name = a.substr(2), value;
    const auto eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (switches.count(name)) {
      values_[name] = inline_value ? value : "true";
      continue;
    }
    if (!flags.count(name))
      MIXTRAIN_FAIL(kInvalidInput, "unknown flag '--" << name << "'", "valid flags: " + valid_list(flags, switches));
    if (!inline_value) {
      if (i + 1 >= argv.size()) MIXTRAIN_FAIL(kInvalidInput, "flag '--" << name << "' needs a value", "");
      value = argv[++i];
    }
    values_[name] = value;
  }
}

std::string Args::str(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

int64_t Args::integer(const std::string& name, int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0' || errno == ERANGE)
    MIXTRAIN_FAIL(kInvalidInput, "--" << name << " expects an integer, got '" << it->second << "'", "");
  return v;
}

double Args::number(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end != '\0' || !std::isfinite(v))
    MIXTRAIN_FAIL(kInvalidInput, "--" << name << " expects a number, got '" << it->second << "'", "");
  return v;
}

std::vector<std::string> Args::str_list(const std::string& name, const std::vector<std::string>& fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  std::vector<std::string> out;
  std::string cur;
  for (char c : it->second + ",") {
    if (c == ',') {
      if (cur.empty()) MIXTRAIN_FAIL(kInvalidInput, "--" << name << " has an empty item in '" << it->second << "'", "");
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  return out;
}

std::vector<int64_t> Args::int_list(const std::string& name, const std::vector<int64_t>& fallback) const {
  if (!has(name)) return fallback;
  std::vector<int64_t> out;
  for (const std::string& item : str_list(name, {})) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (*end != '\0' || v <= 0)
      MIXTRAIN_FAIL(kInvalidInput, "--" << name << " expects positive integers separated by commas, got '" << item << "'", "");
    out.push_back(v);
  }
  return out;
}

}  // namespace mixtrain::cli
