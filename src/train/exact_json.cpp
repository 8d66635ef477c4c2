#include "mixtrain/train/exact_json.h"

#include <cmath>
#include <limits>

#include "mixtrain/core/error.h"

namespace mixtrain {

Json exact_number(double v) {
  if (std::isnan(v)) return Json("nan");
  if (std::isinf(v)) return Json(v > 0 ? "inf" : "-inf");
  return Json(v);
}

Json exact_numbers(const std::vector<double>& values) {
  Json a = Json::array();
  for (double v : values) a.push_back(exact_number(v));
  return a;
}

std::optional<double> read_exact_number(const Json& v) {
  if (v.is_number()) return v.as_number();
  if (!v.is_string()) return std::nullopt;
  const std::string& s = v.as_string();
  if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (s == "inf") return std::numeric_limits<double>::infinity();
  if (s == "-inf") return -std::numeric_limits<double>::infinity();
  return std::nullopt;
}

double read_exact_member(const Json& obj, const char* key, const std::string& what) {
  const Json* v = obj.find(key);
  const std::optional<double> d = v ? read_exact_number(*v) : std::nullopt;
  MIXTRAIN_CHECK(d.has_value(),
                 what << ": '" << key << "' is " << (v ? v->dump() : std::string("missing")) << ", expected a number");
  return *d;
}

int64_t read_exact_integer(const Json& obj, const char* key, int64_t min, int64_t max, const std::string& what) {
  const double d = read_exact_member(obj, key, what);
  // Compared as doubles: every bound used is exact in a double (|bound| <= 2^53).
  MIXTRAIN_CHECK(d == std::floor(d) && d >= static_cast<double>(min) && d <= static_cast<double>(max),
                 what << ": '" << key << "' is " << d << ", expected a whole number in [" << min << ", " << max << "]");
  return static_cast<int64_t>(d);
}

}  // namespace mixtrain
