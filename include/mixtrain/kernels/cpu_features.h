// What the CPU we run on can do, read once with cpuid. An instruction set counts as present only when
// the operating system also saves its registers on a context switch (checked with xgetbv).
#pragma once

#include <string>

namespace mixtrain::kernels {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false;  // vdpbf16ps / vcvtne2ps2bf16
  bool avx512_fp16 = false;  // float16 arithmetic (vfmadd231ph)
  bool amx_bf16 = false, amx_fp16 = false;  // tile matrix multiply; Linux also needs a per-process opt-in
  std::string vendor;      // "GenuineIntel", "AuthenticAMD", ...
  std::string model_name;  // brand string, e.g. "AMD EPYC 9005 ..."
  int logical_cores = 1;   // logical processors this process may run on
};

// Detected on first call; the same object afterwards.
const CpuFeatures& cpu_features();

}  // namespace mixtrain::kernels
