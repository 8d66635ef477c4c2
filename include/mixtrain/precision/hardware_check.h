// Does this CPU run 16-bit floating-point math fast? Checked with CPUID and XGETBV (the OS must also save the
// AVX-512 / AMX register state, or the instructions fault). Used to warn when a mixed policy will run slowly.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace mixtrain {

struct PrecisionSupport {
  // float16 arithmetic: AVX512-FP16 (with OS-enabled AVX-512 state) or AMX-FP16 (with OS-enabled tile state).
  bool fast_float16 = false;
  // bfloat16 arithmetic: AVX512_BF16 or AMX-BF16, under the same OS conditions.
  bool fast_bfloat16 = false;
  // Why a dtype is not fast (empty when it is), e.g. "this CPU has neither AVX512-FP16 nor AMX-FP16".
  std::string float16_reason;
  std::string bfloat16_reason;
  // Relevant features found, in Linux /proc/cpuinfo spelling ("avx512f", "avx512_fp16", "amx_bf16", ...).
  std::vector<std::string> features;
};

// Reads kernels::cpu_features() (detected once per process), so it agrees with the GEMM path selection.
// AMX on Linux additionally needs a per-process permission request (arch_prctl) before first use; this check
// reports what the hardware and OS support, not whether that request has been made.
PrecisionSupport check_cpu_precision_support();

// The warning set_global_policy() prints for `policy_name` on a machine with `support`, or "" when none is due
// (non-mixed policies, or the compute dtype is fast). Says what is missing and what to use instead.
std::string precision_warning_text(std::string_view policy_name, const PrecisionSupport& support);

// Where precision warnings go; the default (also restored by passing nullptr) writes a line to stderr.
void set_precision_warning_sink(std::function<void(const std::string&)> sink);

// Sends a message to the current sink (used by set_global_policy).
void emit_precision_warning(const std::string& message);

}  // namespace mixtrain
