#include "mixtrain/precision/hardware_check.h"

#include <iostream>
#include <mutex>
#include <utility>

#include "mixtrain/kernels/cpu_features.h"

namespace mixtrain {

namespace {

std::mutex& sink_mutex() {
  static std::mutex m;
  return m;
}

std::function<void(const std::string&)>& sink() {
  static std::function<void(const std::string&)> s;
  return s;
}

}  // namespace

PrecisionSupport check_cpu_precision_support() {
  // cpu_features() counts an instruction set only when the OS also saves its registers (XCR0), so a
  // feature the OS left disabled reads as absent here, as it does in /proc/cpuinfo.
  const kernels::CpuFeatures& f = kernels::cpu_features();
  PrecisionSupport out;
  const bool amx_tile = f.amx_bf16 || f.amx_fp16;
  const std::pair<bool, const char*> listed[] = {
      {f.f16c, "f16c"},       {f.avx512f, "avx512f"},   {f.avx512_fp16, "avx512_fp16"}, {f.avx512_bf16, "avx512_bf16"},
      {amx_tile, "amx_tile"}, {f.amx_bf16, "amx_bf16"}, {f.amx_fp16, "amx_fp16"}};
  for (const auto& [present, name] : listed)
    if (present) out.features.push_back(name);

  auto decide = [](bool avx, bool amx, const char* avx_name, const char* amx_name, std::string* reason) {
    if (avx || amx) return true;
    *reason = std::string("this CPU has neither ") + avx_name + " nor " + amx_name +
              " (or the operating system has not enabled their registers)";
    return false;
  };
  out.fast_float16 = decide(f.avx512_fp16, f.amx_fp16, "AVX512-FP16", "AMX-FP16", &out.float16_reason);
  out.fast_bfloat16 = decide(f.avx512_bf16, f.amx_bf16, "AVX512_BF16", "AMX-BF16", &out.bfloat16_reason);
  return out;
}

std::string precision_warning_text(std::string_view policy_name, const PrecisionSupport& support) {
  const std::string policy(policy_name);
  std::string msg = "Mixed precision compatibility check (" + policy + "): WARNING\n";
  if (policy == "mixed_float16") {
    if (support.fast_float16) return "";
    msg += "The dtype policy mixed_float16 may run slowly because " + support.float16_reason +
           ": without it, float16 math runs as conversions to and from float32, which costs time instead of saving "
           "it.\n";
    msg += support.fast_bfloat16
               ? "This CPU has fast bfloat16: use the policy mixed_bfloat16 (it also needs no loss scaling), "
                 "or float32.\n"
               : "Use the policy float32 on this machine.\n";
  } else if (policy == "mixed_bfloat16" || policy.rfind("mixed_float8", 0) == 0) {
    // The float8 policies multiply their widened operands on the bfloat16 GEMM.
    if (support.fast_bfloat16) return "";
    msg += "The dtype policy " + policy + " may run slowly because " + support.bfloat16_reason +
           ": without it, bfloat16 math runs as conversions to and from float32.\n";
    msg += support.fast_float16 ? "This CPU has fast float16: use mixed_float16 (with loss scaling) or float32.\n"
                                : "Use the policy float32 on this machine.\n";
  } else {
    return "";
  }
  msg +=
      "Memory-bound work still halves its bytes with 16-bit types, so a memory-limited model may benefit anyway. "
      "This message will only be logged once.";
  return msg;
}

void set_precision_warning_sink(std::function<void(const std::string&)> s) {
  std::lock_guard<std::mutex> lock(sink_mutex());
  sink() = std::move(s);
}

void emit_precision_warning(const std::string& message) {
  std::function<void(const std::string&)> s;
  {
    std::lock_guard<std::mutex> lock(sink_mutex());
    s = sink();
  }
  if (s) {
    s(message);
  } else {
    std::cerr << message << std::endl;
  }
}

}  // namespace mixtrain
