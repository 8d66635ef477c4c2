#include "mixtrain/precision/policy.h"

#include <array>
#include <atomic>
#include <mutex>
#include <set>
#include <string>

#include "mixtrain/core/error.h"
#include "mixtrain/precision/hardware_check.h"

namespace mixtrain {

namespace {

// Every policy there is; the global policy points at one of these, so global_policy() can hand out a reference
// that never dangles however often the policy changes.
const std::array<DTypePolicy, 7>& all_policies();

std::string joined_names() {
  std::string s;
  for (const std::string& n : DTypePolicy::valid_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

std::atomic<const DTypePolicy*>& global_slot() {
  static std::atomic<const DTypePolicy*> slot{&all_policies()[0]};
  return slot;
}

// Runs the hardware check at most once per process and warns at most once per mixed policy.
void check_hardware_once(const DTypePolicy& policy) {
  if (!policy.is_mixed()) return;
  static std::once_flag check_flag;
  static PrecisionSupport support;
  std::call_once(check_flag, [] { support = check_cpu_precision_support(); });
  static std::mutex warned_mutex;
  static std::set<std::string> warned;
  {
    std::lock_guard<std::mutex> lock(warned_mutex);
    if (!warned.insert(policy.name()).second) return;
  }
  const std::string text = precision_warning_text(policy.name(), support);
  if (!text.empty()) emit_precision_warning(text);
}

}  // namespace

DTypePolicy::DTypePolicy() : DTypePolicy("float32", DType::kFloat32, DType::kFloat32) {}

DTypePolicy::DTypePolicy(std::string name, DType compute, DType variable, DType float8_forward,
                         DType float8_backward)
    : name_(std::move(name)),
      compute_(compute),
      variable_(variable),
      float8_forward_(float8_forward),
      float8_backward_(float8_backward) {}

const std::vector<std::string>& DTypePolicy::valid_names() {
  static const std::vector<std::string> names = {"float32", "float16", "bfloat16", "mixed_float16", "mixed_bfloat16",
                                                 "mixed_float8",   "mixed_float8_e4m3"};
  return names;
}

DTypePolicy DTypePolicy::from_name(std::string_view name) {
  if (name == "mixed_float16") return DTypePolicy("mixed_float16", DType::kFloat16, DType::kFloat32);
  if (name == "mixed_bfloat16") return DTypePolicy("mixed_bfloat16", DType::kBFloat16, DType::kFloat32);
  // Everything but the GEMM operands runs as under mixed_bfloat16.
  if (name == "mixed_float8")
    return DTypePolicy("mixed_float8", DType::kBFloat16, DType::kFloat32, DType::kFloat8E4M3FN, DType::kFloat8E5M2);
  if (name == "mixed_float8_e4m3")
    return DTypePolicy("mixed_float8_e4m3", DType::kBFloat16, DType::kFloat32, DType::kFloat8E4M3FN,
                       DType::kFloat8E4M3FN);
  DType dtype = DType::kUInt8;
  try {
    dtype = parse_dtype(name);
  } catch (const Error&) {
    // Reported below with the policy names, which are what the caller needs.
  }
  if (!is_float(dtype)) {
    MIXTRAIN_FAIL(kInvalidInput, "unknown dtype policy '" << name << "'; valid names: " << joined_names(),
                  "use mixed_float16, mixed_bfloat16 or mixed_float8 for mixed precision, float32 for full precision");
  }
  return DTypePolicy(dtype_name(dtype), dtype, dtype);
}

namespace {
const std::array<DTypePolicy, 7>& all_policies() {
  static const std::array<DTypePolicy, 7> table = {
      DTypePolicy::from_name("float32"), DTypePolicy::from_name("float16"), DTypePolicy::from_name("bfloat16"),
      DTypePolicy::from_name("mixed_float16"), DTypePolicy::from_name("mixed_bfloat16"),
      DTypePolicy::from_name("mixed_float8"),  DTypePolicy::from_name("mixed_float8_e4m3")};
  return table;
}
}  // namespace

void set_global_policy(const DTypePolicy& policy) {
  for (const DTypePolicy& p : all_policies()) {
    if (p == policy) {
      global_slot().store(&p);
      check_hardware_once(p);
      return;
    }
  }
  MIXTRAIN_FAIL(kInternal, "policy '" << policy.name() << "' is missing from the policy table", "");
}

void set_global_policy(std::string_view name) { set_global_policy(DTypePolicy::from_name(name)); }

const DTypePolicy& global_policy() { return *global_slot().load(); }

}  // namespace mixtrain
