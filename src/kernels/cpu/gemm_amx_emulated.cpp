// The AMX-BF16 kernel (gemm_amx_kernel.h) on the portable emulation of its instructions
// (amx_shim_emulated.h): compiled without instruction-set flags, so the tests run the AMX path's packing,
// blocking, edges and epilogue on every CPU. Never chosen for speed.
#include "kernels/cpu/amx_shim_emulated.h"
// The kernel source after its shim.
#include "kernels/cpu/gemm_amx_kernel.h"

namespace mixtrain::kernels::cpu {

static_assert(64 / amx::kMR <= amx::kMaxColumnTiles, "a chunk of rows is one column of tiles");

// Small cache blocks (3 tile steps deep, 3 micro-tiles wide, 2 tall), so that small test shapes already
// cross k, column and row blocks and the padded ends of each.
const GemmBackend kAmxEmulatedBackend = {"amx_emulated", amx::kMR,   amx::kNR,          64,
                                         96,             96,         amx::pack,         amx::micro_kernel,
                                         2,              amx::kStep, amx::pack_a,       amx::thread_begin,
                                         amx::thread_end,   1,           amx::column_kernel};

// The float16 split with the same small blocks (2 source steps, 6 packed).
const GemmBackend kAmxF16EmulatedBackend = {"amx_f16_emulated", amx::kMR,    amx::kNR,
                                            64,                 64,          96,
                                            amx::pack_b_split,  amx::micro_kernel_split,
                                            2,                  amx::kStep,  amx::pack_a_split,
                                            amx::thread_begin,  amx::thread_end,
                                            amx::kSplitCopies, amx::column_kernel_split};

}  // namespace mixtrain::kernels::cpu
