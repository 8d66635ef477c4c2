#include "mixtrain/kernels/cpu_features.h"

#include <cpuid.h>
#include <sched.h>

#include <cstdint>
#include <cstring>
#include <thread>

namespace mixtrain::kernels {
namespace {

struct Regs {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

// Zeros when the leaf is beyond what the CPU reports, so an old CPU reads as "feature absent".
Regs cpuid(unsigned leaf, unsigned subleaf) {
  Regs r;
  if (!__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx)) r = Regs{};
  return r;
}

bool bit(unsigned reg, int i) { return (reg >> i) & 1u; }

// XCR0: which register states the OS saves. Read with the raw opcode so no -mxsave flag is needed.
uint64_t xgetbv0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

std::string trim(std::string s) {
  const auto first = s.find_first_not_of(' ');
  if (first == std::string::npos) return "";
  const auto last = s.find_last_not_of(' ');
  return s.substr(first, last - first + 1);
}

CpuFeatures detect() {
  CpuFeatures f;
  const Regs l0 = cpuid(0, 0);
  char vendor[13] = {};
  std::memcpy(vendor, &l0.ebx, 4);
  std::memcpy(vendor + 4, &l0.edx, 4);
  std::memcpy(vendor + 8, &l0.ecx, 4);
  f.vendor = vendor;

  const Regs ext = cpuid(0x80000000u, 0);
  if (ext.eax >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      const Regs r = cpuid(0x80000002u + i, 0);
      std::memcpy(brand + 16 * i, &r, 16);
    }
    f.model_name = trim(brand);
  }

  const unsigned max_leaf = l0.eax;
  const Regs l1 = cpuid(1, 0);
  const Regs l7 = max_leaf >= 7 ? cpuid(7, 0) : Regs{};
  const Regs l7s1 = (max_leaf >= 7 && l7.eax >= 1) ? cpuid(7, 1) : Regs{};

  // AVX state (XMM + YMM) must be enabled by the OS before any VEX instruction is safe.
  const bool osxsave = bit(l1.ecx, 27);
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool os_avx = bit(l1.ecx, 28) && (xcr0 & 0x6) == 0x6;
  // AVX-512 adds opmask, upper halves of zmm0-15, and zmm16-31 (XCR0 bits 5, 6, 7).
  const bool os_avx512 = os_avx && (xcr0 & 0xE0) == 0xE0;
  // AMX tile config and tile data (bits 17, 18).
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;

  f.fma = os_avx && bit(l1.ecx, 12);
  f.f16c = os_avx && bit(l1.ecx, 29);
  f.avx2 = os_avx && bit(l7.ebx, 5);
  f.avx512f = os_avx512 && bit(l7.ebx, 16);
  f.avx512dq = f.avx512f && bit(l7.ebx, 17);
  f.avx512bw = f.avx512f && bit(l7.ebx, 30);
  f.avx512vl = f.avx512f && bit(l7.ebx, 31);
  f.avx512_fp16 = f.avx512f && bit(l7.edx, 23);
  f.avx512_bf16 = f.avx512f && bit(l7s1.eax, 5);
  f.amx_bf16 = os_amx && bit(l7.edx, 22) && bit(l7.edx, 24);
  f.amx_fp16 = os_amx && bit(l7s1.eax, 21) && bit(l7.edx, 24);

  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    f.logical_cores = CPU_COUNT(&set);
  } else {
    f.logical_cores = static_cast<int>(std::thread::hardware_concurrency());
  }
  if (f.logical_cores < 1) f.logical_cores = 1;
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

}  // namespace mixtrain::kernels
