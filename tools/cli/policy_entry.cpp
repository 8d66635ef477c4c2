#include "policy_entry.h"

#include "mixtrain/core/error.h"

namespace mixtrain::cli {

namespace {
// One KEY=VALUE of an entry, onto cfg.
void apply_setting(RunConfig& cfg, const std::string& entry, const std::string& setting) {
  const size_t eq = setting.find('=');
  const std::string key = setting.substr(0, eq), value = eq == std::string::npos ? "" : setting.substr(eq + 1);
  MIXTRAIN_CHECK(eq != std::string::npos && !value.empty(),
                 "--policies entry '" << entry << "': expected KEY=VALUE after ':', got '" << setting << "'");
  if (key == "master-rounding") cfg.master_rounding = value;
  else if (key == "optimizer-state") cfg.optimizer_state = value;
  else
    MIXTRAIN_FAIL(kInvalidInput, "--policies entry '" << entry << "': unknown setting '" << key
                                                        << "' (expected master-rounding or optimizer-state)",
                  "");
}
}  // namespace

void apply_policy_entry(RunConfig& cfg, const std::string& entry) {
  size_t start = entry.find(':');
  cfg.policy = entry.substr(0, start);
  while (start != std::string::npos) {
    const size_t next = entry.find(':', start + 1);
    apply_setting(cfg, entry, entry.substr(start + 1, next == std::string::npos ? std::string::npos : next - start - 1));
    start = next;
  }
}

}  // namespace mixtrain::cli
