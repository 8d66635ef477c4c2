#include "mixtrain/train/history.h"

namespace mixtrain {

double log_value(const Logs& logs, const std::string& key, double fallback) {
  for (const auto& [k, v] : logs)
    if (k == key) return v;
  return fallback;
}

bool has_log(const Logs& logs, const std::string& key) {
  for (const auto& kv : logs)
    if (kv.first == key) return true;
  return false;
}

}  // namespace mixtrain
