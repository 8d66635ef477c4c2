// AMX-BF16 GEMM path: gemm_amx_kernel.h on the real tile instructions. Compiled with -mamx-tile
// -mamx-bf16 -mavx512f/bw/vl/dq -mfma -mf16c; reached only for bfloat16 inputs on a CPU with AMX-BF16 and
// the AVX-512 path, after the OS granted this process the tile state.
#include "kernels/cpu/amx_shim_native.h"
// The kernel source after its shim.
#include "kernels/cpu/gemm_amx_kernel.h"

namespace mixtrain::kernels::cpu {

// Deep k blocks (1024, padded to a multiple of 32): an A panel (32 x 1024 bfloat16, 64 KiB) and a B panel
// (64 KiB) stream from L2 while the 128-row A chunk (256 KiB) stays there. Measured on one Sapphire Rapids
// core (n = 512..2048, bench/gemm_bench.cpp): k blocks of 256..512, which keep a B panel in L1, were
// 10-20% slower, because every extra k block is another pass over the float32 partial sums of C, and
// C (4 MiB of float32 at n = 1024) does not fit in L2.
const GemmBackend kAmxBackend = {"amx",      amx::kMR,    amx::kNR,          128,
                                 1024,       2048,        amx::pack,         amx::micro_kernel,
                                 2,          amx::kStep,  amx::pack_a,       amx::thread_begin,
                                 amx::thread_end};

// float16 through the split: source k blocks of 1024 (3,072 packed k deep), the packing scratch's limit. Measured
// on one Sapphire Rapids core at n = 1024 and 2048, blocks of 256 and 384 were 5-10% slower than 512 to 1024:
// every extra k block is another pass over C's float32 partial sums.
const GemmBackend kAmxF16Backend = {"amx_f16",        amx::kMR,    amx::kNR,
                                    128,              1024,         2048,
                                    amx::pack_b_split, amx::micro_kernel_split,
                                    2,                amx::kStep,  amx::pack_a_split,
                                    amx::thread_begin, amx::thread_end,
                                    amx::kSplitCopies};

}  // namespace mixtrain::kernels::cpu
