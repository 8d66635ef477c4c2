#include "mixtrain/precision/hardware_check.h"

#include <cstdint>
#include <iostream>
#include <mutex>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define MIXTRAIN_X86 1
#endif

namespace mixtrain {

namespace {

#ifdef MIXTRAIN_X86
// CPUID bit positions (Intel SDM vol. 2A, CPUID leaf 07H; Linux cpufeatures names in comments).
constexpr uint32_t kLeaf1EcxOsxsave = 1u << 27;     // OS uses XSAVE/XRSTOR, so XGETBV is available
constexpr uint32_t kLeaf7EbxAvx512f = 1u << 16;     // avx512f
constexpr uint32_t kLeaf7EdxAmxBf16 = 1u << 22;     // amx_bf16
constexpr uint32_t kLeaf7EdxAvx512Fp16 = 1u << 23;  // avx512_fp16
constexpr uint32_t kLeaf7EdxAmxTile = 1u << 24;     // amx_tile
constexpr uint32_t kLeaf7s1EaxAvx512Bf16 = 1u << 5;  // avx512_bf16
constexpr uint32_t kLeaf7s1EaxAmxFp16 = 1u << 21;    // amx_fp16
constexpr uint32_t kLeaf1EcxF16c = 1u << 29;         // f16c (conversions only, not arithmetic)
// XCR0 state components: SSE|AVX|opmask|ZMM_Hi256|Hi16_ZMM for AVX-512, XTILECFG|XTILEDATA for AMX.
constexpr uint64_t kXcr0Avx512 = 0xE6;
constexpr uint64_t kXcr0Amx = (uint64_t{1} << 17) | (uint64_t{1} << 18);

uint64_t read_xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}
#endif

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
  PrecisionSupport out;
#ifdef MIXTRAIN_X86
  uint32_t a = 0, b = 0, c = 0, d = 0;
  const unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf < 7) {
    out.float16_reason = out.bfloat16_reason = "this CPU is too old to report AVX-512 or AMX features";
    return out;
  }
  __cpuid(1, a, b, c, d);
  const bool osxsave = (c & kLeaf1EcxOsxsave) != 0;
  if (c & kLeaf1EcxF16c) out.features.push_back("f16c");
  const uint64_t xcr0 = osxsave ? read_xcr0() : 0;
  const bool os_avx512 = (xcr0 & kXcr0Avx512) == kXcr0Avx512;
  const bool os_amx = (xcr0 & kXcr0Amx) == kXcr0Amx;

  __cpuid_count(7, 0, a, b, c, d);
  const uint32_t max_subleaf = a;
  const bool avx512f = (b & kLeaf7EbxAvx512f) != 0;
  const bool avx512_fp16 = avx512f && (d & kLeaf7EdxAvx512Fp16) != 0;
  const bool amx_tile = (d & kLeaf7EdxAmxTile) != 0;
  const bool amx_bf16 = amx_tile && (d & kLeaf7EdxAmxBf16) != 0;
  bool avx512_bf16 = false, amx_fp16 = false;
  if (max_subleaf >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    avx512_bf16 = avx512f && (a & kLeaf7s1EaxAvx512Bf16) != 0;
    amx_fp16 = amx_tile && (a & kLeaf7s1EaxAmxFp16) != 0;
  }
  if (avx512f) out.features.push_back("avx512f");
  if (avx512_fp16) out.features.push_back("avx512_fp16");
  if (avx512_bf16) out.features.push_back("avx512_bf16");
  if (amx_tile) out.features.push_back("amx_tile");
  if (amx_bf16) out.features.push_back("amx_bf16");
  if (amx_fp16) out.features.push_back("amx_fp16");

  // The instruction sets are usable only when the OS saves their registers across context switches.
  auto decide = [&](bool avx, bool amx, const char* avx_name, const char* amx_name, std::string* reason) {
    if ((avx && os_avx512) || (amx && os_amx)) return true;
    if (avx || amx) {
      *reason = std::string("this CPU has ") + (avx ? avx_name : amx_name) +
                " but the operating system has not enabled its register state (XCR0)";
    } else {
      *reason = std::string("this CPU has neither ") + avx_name + " nor " + amx_name;
    }
    return false;
  };
  out.fast_float16 = decide(avx512_fp16, amx_fp16, "AVX512-FP16", "AMX-FP16", &out.float16_reason);
  out.fast_bfloat16 = decide(avx512_bf16, amx_bf16, "AVX512_BF16", "AMX-BF16", &out.bfloat16_reason);
#else
  out.float16_reason = out.bfloat16_reason = "this is not an x86-64 CPU; mixtrain's fast 16-bit CPU kernels need "
                                             "AVX-512 or AMX";
#endif
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
  } else if (policy == "mixed_bfloat16") {
    if (support.fast_bfloat16) return "";
    msg += "The dtype policy mixed_bfloat16 may run slowly because " + support.bfloat16_reason +
           ": without it, bfloat16 math runs as conversions to and from float32.\n";
    msg += support.fast_float16 ? "This CPU has fast float16: use mixed_float16 (with loss scaling) or float32.\n"
                                : "Use the policy float32 on this machine.\n";
  } else {
    return "";
  }
  msg += "Memory-bound work still halves its bytes with 16-bit types, so a memory-limited model may benefit anyway. "
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
