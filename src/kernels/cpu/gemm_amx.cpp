// AMX-BF16 GEMM path: gemm_amx_kernel.h on the real tile instructions. Compiled with -mamx-tile
// -mamx-bf16 -mavx512f/bw/vl/dq -mfma -mf16c; reached only for bfloat16 inputs on a CPU with AMX-BF16 and
// the AVX-512 path, after the OS granted this process the tile state.
#include "kernels/cpu/amx_shim_native.h"
// The kernel source after its shim.
#include "kernels/cpu/gemm_amx_kernel.h"

namespace mixtrain::kernels::cpu {

// Deep k blocks (1024, padded to a multiple of 32) and column blocks of 384: a B block (1024 x 384
// bfloat16, 768 KiB) stays in L2 beside the 128-row A chunk (256 KiB), and the column kernel keeps a slice
// of each B panel in L1 (gemm_amx_kernel.h: run_column). Measured on this machine kind's Sapphire Rapids
// class Xeon, 2 threads, alternating runs: n = 1024 went from about 1,900 GFLOP/s (column blocks of 2048,
// B streaming from L3; one tile at a time) to 2,050 with either change alone and 2,200 with both.
const GemmBackend kAmxBackend = amx::make_backend<128>("amx", amx::Inputs::kBFloat16, 1024, 384);

// float16 through the split: source k blocks of 1024 (3,072 packed k deep), the packing scratch's limit. Measured
// on one Sapphire Rapids core at n = 1024 and 2048, blocks of 256 and 384 were 5-10% slower than 512 to 1024:
// every extra k block is another pass over C's float32 partial sums.
const GemmBackend kAmxF16Backend = amx::make_backend<128>("amx_f16", amx::Inputs::kFloat16Split, 1024, 2048);

}  // namespace mixtrain::kernels::cpu
