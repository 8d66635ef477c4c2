// Doubles in checkpoint metadata that must read back bit for bit: finite values as JSON numbers (Json::dump
// writes the shortest spelling that reads back the same), NaN and the infinities as the strings "nan", "inf" and
// "-inf", which JSON has no numbers for (a NaN loss is part of a run's history; a best value starts at infinity).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mixtrain/core/json.h"

namespace mixtrain {

Json exact_number(double v);
Json exact_numbers(const std::vector<double>& values);
// The double exact_number wrote; nullopt for anything else.
std::optional<double> read_exact_number(const Json& v);

// Member `key` of the object `obj` as exact_number wrote it; an Error "<what>: '<key>' is <value>, expected a
// number" otherwise (what names the saved state, e.g. "EarlyStopping state" or "recovery state").
double read_exact_member(const Json& obj, const char* key, const std::string& what);
// The same, a whole number in [min, max]; an Error naming what, key, the value and the bounds otherwise.
int64_t read_exact_integer(const Json& obj, const char* key, int64_t min, int64_t max, const std::string& what);

}  // namespace mixtrain
