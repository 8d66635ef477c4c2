// Doubles in checkpoint metadata that must read back bit for bit: finite values as JSON numbers (Json::dump
// writes the shortest spelling that reads back the same), NaN and the infinities as the strings "nan", "inf" and
// "-inf", which JSON has no numbers for (a NaN loss is part of a run's history; a best value starts at infinity).
#pragma once

#include <optional>
#include <vector>

#include "mixtrain/core/json.h"

namespace mixtrain {

Json exact_number(double v);
Json exact_numbers(const std::vector<double>& values);
// The double exact_number wrote; nullopt for anything else.
std::optional<double> read_exact_number(const Json& v);

}  // namespace mixtrain
