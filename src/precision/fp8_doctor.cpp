// doctor's FP8 lines (precision/doctor.h): where the float8 policies run on this machine, and how.
#include <string>
#include <vector>

#include "mixtrain/precision/doctor.h"

namespace mixtrain {

namespace {

// FP8 tensor cores arrived with Ada (compute capability 8.9) and Hopper (9.0).
constexpr int kFp8Major = 8, kFp8Minor = 9;

std::string bf16_clause(const std::string& method) {
  if (method == "amx") return "AMX bfloat16 tiles";
  if (method == "dot") return "AVX512-BF16 dot products (vdpbf16ps)";
  return "bfloat16 inputs widened to float32 (no bfloat16 arithmetic on this CPU)";
}

}  // namespace

std::vector<std::string> fp8_lines(const std::string& bf16_method, const kernels::GpuProbe& probe) {
  std::vector<std::string> out;
  out.push_back("cpu: emulated: float8 operands (E4M3, E5M2) widened exactly to bfloat16 and multiplied on the bfloat16 "
                "GEMM by " + bf16_clause(bf16_method) + ", float32 accumulation, the scales applied after; "
                "quantization bit-exact to the formats' definitions");
  for (size_t i = 0; i < probe.gpus.size(); ++i) {
    const kernels::GpuInfo& g = probe.gpus[i];
    const std::string cc = std::to_string(g.cc_major) + "." + std::to_string(g.cc_minor);
    const bool fp8_cores = g.cc_major > kFp8Major || (g.cc_major == kFp8Major && g.cc_minor >= kFp8Minor);
    out.push_back("gpu" + std::to_string(i) + ": " + g.name + ", compute capability " + cc +
                  (fp8_cores ? " has FP8 tensor cores, which mixtrain does not use yet: the float8 policies run on the "
                               "CPU"
                             : " has no FP8 tensor cores (they need 8.9); the float8 policies run on the CPU"));
  }
  if (probe.gpus.empty())
    out.push_back("FP8 tensor cores need a CUDA GPU of compute capability 8.9 or later (Ada, Hopper, Blackwell)");
  return out;
}

}  // namespace mixtrain
