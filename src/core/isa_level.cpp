#include "mixtrain/core/isa_level.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

#include "mixtrain/core/environment.h"
#include "mixtrain/core/error.h"

namespace mixtrain {

namespace {
// -1: no level forced for testing.
std::atomic<int> g_forced_level{-1};

// -1 when MIXTRAIN_ISA is unset or empty.
int environment_level() {
  static const int level = [] {
    const std::optional<std::string> text = env::mixtrain_isa();
    if (!text || text->empty()) return -1;
    const std::optional<IsaLevel> parsed = parse_isa_level(*text);
    if (!parsed)
      MIXTRAIN_FAIL(kInvalidInput, "MIXTRAIN_ISA='" << *text << "' names no instruction-set level",
                    "set MIXTRAIN_ISA to scalar, avx2 or avx512, or unset it");
    return static_cast<int>(*parsed);
  }();
  return level;
}
}  // namespace

const char* isa_level_name(IsaLevel level) {
  switch (level) {
    case IsaLevel::kScalar: return "scalar";
    case IsaLevel::kAvx2: return "avx2";
    case IsaLevel::kAvx512: return "avx512";
  }
  return "scalar";
}

std::optional<IsaLevel> parse_isa_level(std::string_view name) {
  for (IsaLevel l : {IsaLevel::kScalar, IsaLevel::kAvx2, IsaLevel::kAvx512})
    if (name == isa_level_name(l)) return l;
  return std::nullopt;
}

IsaLevel supported_isa_level() {
  // __builtin_cpu_supports counts an AVX or AVX-512 feature only where the operating system saves its registers.
  static const IsaLevel level = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    return avx512 ? IsaLevel::kAvx512 : avx2 ? IsaLevel::kAvx2 : IsaLevel::kScalar;
  }();
  return level;
}

IsaLevel isa_level() {
  int wanted = g_forced_level.load(std::memory_order_relaxed);
  if (wanted < 0) wanted = environment_level();
  const int supported = static_cast<int>(supported_isa_level());
  return static_cast<IsaLevel>(wanted < 0 ? supported : std::min(wanted, supported));
}

IsaLevel set_isa_level_for_testing(std::optional<IsaLevel> level) {
  g_forced_level.store(level ? static_cast<int>(*level) : -1, std::memory_order_relaxed);
  return isa_level();
}

}  // namespace mixtrain
