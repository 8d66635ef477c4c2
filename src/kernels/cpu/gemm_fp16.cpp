// AVX512-FP16 GEMM path for float16 inputs: gemm_fp16_kernel.h on the real instructions. Compiled with
// -mavx512fp16 -mavx512f/bw/vl/dq -mfma -mf16c; reached only for float16 inputs on a CPU with
// AVX512-FP16 and the AVX-512 path, when the driver chose this method.
#include "kernels/cpu/fp16_shim_native.h"
// The kernel source after its shim.
#include "kernels/cpu/gemm_fp16_kernel.h"

namespace mixtrain::kernels::cpu {

// The bfloat16 dot path's blocking (same packed bytes per k): the A chunk (120 x 2048 float16, 480 KiB)
// and the B panel in use (2048 x 32 float16, 128 KiB) share L2.
const GemmBackend kAvx512Fp16Backend = {"avx512_fp16", fp16::kMR, fp16::kNR, 120, 2048, 2048, fp16::pack,
                                        fp16::micro_kernel, 2};

}  // namespace mixtrain::kernels::cpu
