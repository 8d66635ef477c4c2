#include "mixtrain/train/exact_json.h"

#include <cmath>
#include <limits>

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

}  // namespace mixtrain
