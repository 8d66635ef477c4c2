// Forced into every translation unit when clang compiles mixtrain (the sanitizer and fuzz builds; releases use
// GCC). It lets a GCC-only construct compile under clang 14, without changing what the GCC build does:
// __builtin_cpu_supports("f16c") (src/core/isa_level.cpp): clang before 17 does not know the feature name and
//   refuses the call; "f16c" is answered from CPUID (leaf 1, ECX bit 29) and other names go to the builtin.
// Remove it once the code it serves stops needing it.
#pragma once

#if defined(__clang__) && defined(__cplusplus)
#include <cpuid.h>
#include <cstring>

inline bool mixtrain_cpu_supports_with_f16c(const char* feature) {
  if (std::strcmp(feature, "f16c") == 0) {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  }
  if (std::strcmp(feature, "avx2") == 0) return __builtin_cpu_supports("avx2");
  if (std::strcmp(feature, "fma") == 0) return __builtin_cpu_supports("fma");
  if (std::strcmp(feature, "avx512f") == 0) return __builtin_cpu_supports("avx512f");
  if (std::strcmp(feature, "avx512bw") == 0) return __builtin_cpu_supports("avx512bw");
  if (std::strcmp(feature, "avx512vl") == 0) return __builtin_cpu_supports("avx512vl");
  if (std::strcmp(feature, "avx512dq") == 0) return __builtin_cpu_supports("avx512dq");
  return false;  // a feature name used in the code must be added here
}
#define __builtin_cpu_supports(feature) mixtrain_cpu_supports_with_f16c(feature)
#endif
