#include "args.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "mixtrain/core/error.h"

namespace mixtrain::cli {

namespace {

// Whole-string base-10 int64 with an optional leading '+'; false for anything else, including values past int64.
bool parse_int64(const std::string& text, int64_t* out) {
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  if (begin != end && *begin == '+' && begin + 1 != end && begin[1] != '-') ++begin;
  const auto [ptr, ec] = std::from_chars(begin, end, *out);
  return begin != end && ec == std::errc() && ptr == end;
}

// Whether text is a well-formed integer too large in magnitude for int64 (so the message can give the range).
bool out_of_int64(const std::string& text) {
  int64_t ignored = 0;
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  if (begin != end && *begin == '+' && begin + 1 != end && begin[1] != '-') ++begin;
  const auto [ptr, ec] = std::from_chars(begin, end, ignored);
  return ec == std::errc::result_out_of_range && ptr == end;
}

// "a positive integer no larger than 2147483647", "an integer from -5 to 5", ...: the words for a range.
std::string range_words(int64_t min, int64_t max) {
  if (min == 1) return "a positive integer no larger than " + std::to_string(max);
  if (min == 0) return "a non-negative integer no larger than " + std::to_string(max);
  return "an integer from " + std::to_string(min) + " to " + std::to_string(max);
}

int64_t parse_integer(const std::string& name, const std::string& text, int64_t min, int64_t max) {
  int64_t v = 0;
  const bool parsed = parse_int64(text, &v);
  if (!parsed && !out_of_int64(text))
    MIXTRAIN_FAIL(kInvalidInput, "--" << name << " expects an integer, got '" << text << "'", "");
  if (!parsed || v < min || v > max)
    MIXTRAIN_FAIL(kInvalidInput, "--" << name << " must be " << range_words(min, max) << ", got " << text, "");
  return v;
}

std::string valid_list(const std::set<std::string>& flags, const std::set<std::string>& switches) {
  std::string s;
  for (const auto& f : flags) s += (s.empty() ? "--" : ", --") + f;
  for (const auto& f : switches) s += (s.empty() ? "--" : ", --") + f;
  return s;
}
}  // namespace

IntRange integer_range(const std::string& name) {
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  if (name == "epochs" || name == "batch-size" || name == "steps" || name == "hidden" || name == "sizes" ||
      name == "accumulate")
    return {1, kIntMax};
  if (name == "seed") return {0, std::numeric_limits<int64_t>::max()};
  // A count of steps, which a long run by steps can take past 2^31.
  if (name == "save-every") return {1, std::numeric_limits<int64_t>::max()};
  return {std::numeric_limits<int32_t>::min(), kIntMax};
}

Args::Args(const std::vector<std::string>& argv, const std::set<std::string>& flags,
           const std::set<std::string>& switches) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (is_help(a)) throw HelpRequested{};
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
    // The last of two values used to win silently (`--epochs 3 ... --epochs 5` trained 5 epochs).
    if (values_.count(name))
      MIXTRAIN_FAIL(kInvalidInput, "flag '--" << name << "' is given twice ('" << values_[name] << "' and '" << value
                                              << "')", "give each flag once");
    values_[name] = value;
  }
}

std::string Args::path(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return "";
  if (it->second.empty())
    MIXTRAIN_FAIL(kInvalidInput, "--" << name << " needs a path, got an empty value", "give a path, or leave the flag out");
  return it->second;
}

std::string Args::str(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

bool Args::on_off(const std::string& name, bool fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  MIXTRAIN_CHECK(it->second == "on" || it->second == "off",
                 "--" << name << " must be on or off, got '" << it->second << "'");
  return it->second == "on";
}

int64_t Args::integer(const std::string& name, int64_t fallback, int64_t min, int64_t max) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  return parse_integer(name, it->second, min, max);
}

int64_t Args::integer(const std::string& name, int64_t fallback) const {
  const IntRange r = integer_range(name);
  return integer(name, fallback, r.min, r.max);
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
  const int64_t max = integer_range(name).max;
  std::vector<int64_t> out;
  for (const std::string& item : str_list(name, {})) {
    int64_t v = 0;
    if (!parse_int64(item, &v) && !out_of_int64(item))
      MIXTRAIN_FAIL(kInvalidInput, "--" << name << " expects positive integers separated by commas, got '" << item << "'", "");
    if (out_of_int64(item) || v < 1 || v > max)
      MIXTRAIN_FAIL(kInvalidInput, "--" << name << " items must be integers from 1 to " << max << ", got '" << item << "'", "");
    out.push_back(v);
  }
  return out;
}

}  // namespace mixtrain::cli
