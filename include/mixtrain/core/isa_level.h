// The x86 instruction-set level the CPU kernels run at: scalar (the x86-64 baseline), avx2 (AVX2 + FMA + F16C)
// or avx512 (AVX-512 F, BW, VL and DQ on top of those). Every routine that picks code by instruction set at run
// time (the GEMM paths, the float16/bfloat16 conversions, the optimizer update passes) asks isa_level(), so the
// environment variable MIXTRAIN_ISA=scalar|avx2|avx512 forces all of them at once, and a test can run each
// level's code in one process on a CPU that has the highest.
#pragma once

#include <optional>
#include <string_view>

namespace mixtrain {

enum class IsaLevel : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// "scalar", "avx2" or "avx512".
const char* isa_level_name(IsaLevel level);
// The level a name denotes, or nullopt for any other text.
std::optional<IsaLevel> parse_isa_level(std::string_view name);

// The highest level this CPU and its operating system can run (detected once).
IsaLevel supported_isa_level();

// The level to run at: the level forced for testing, else MIXTRAIN_ISA (read once; a name that is not a level is
// an Error naming the variable), else the supported level; never above the supported level. Cheap: callers ask
// on every call rather than caching, so a forced level takes effect at once.
IsaLevel isa_level();

// The one way CPU code picks its instruction set at run time: of one variant per level (a level with nothing of its
// own passes the one below again), the variant `level` names. for_isa_level picks at isa_level(). The GEMM's paths
// (kernels/gemm.cpp), the conversions (core/tensor.cpp), the elementwise kernels' blocks (ops/cpu/float_lanes.h)
// and the optimizer's update spans (ops/cpu/update_isa_variants.h) all choose through it: MIXTRAIN_ISA and the
// tests' override reach every one the same way, and adding a level is one more argument here.
template <class T>
T pick_for_isa(IsaLevel level, T scalar, T avx2, T avx512) {
  switch (level) {
    case IsaLevel::kAvx512: return avx512;
    case IsaLevel::kAvx2: return avx2;
    case IsaLevel::kScalar: break;
  }
  return scalar;
}
template <class T>
T for_isa_level(T scalar, T avx2, T avx512) {
  return pick_for_isa(isa_level(), scalar, avx2, avx512);
}

// Forces the level for tests (capped by the CPU, as MIXTRAIN_ISA is); nullopt returns to the default. Returns
// isa_level() afterwards.
IsaLevel set_isa_level_for_testing(std::optional<IsaLevel> level);

}  // namespace mixtrain
