// The AVX512-FP16 kernel (gemm_fp16_kernel.h) on the portable emulation of its instructions
// (fp16_shim_emulated.h): compiled without instruction-set flags, so the tests run the float16 path's
// packing, promotion, edges and epilogue on every CPU. Never chosen for speed.
#include "kernels/cpu/fp16_shim_emulated.h"
// The kernel source after its shim.
#include "kernels/cpu/gemm_fp16_kernel.h"

namespace mixtrain::kernels::cpu {

// Small cache blocks, so that small test shapes already cross k, column and row blocks.
const GemmBackend kAvx512Fp16EmulatedBackend = {"avx512_fp16_emulated", fp16::kMR, fp16::kNR, 24, 96, 64,
                                                fp16::pack, fp16::micro_kernel, 2};

}  // namespace mixtrain::kernels::cpu
