// The AMX-BF16 kernel (gemm_amx_kernel.h) on the portable emulation of its instructions
// (amx_shim_emulated.h): compiled without instruction-set flags, so the tests run the AMX path's packing,
// blocking, edges and epilogue on every CPU. Never chosen for speed.
#include "kernels/cpu/amx_shim_emulated.h"
// The kernel source after its shim.
#include "kernels/cpu/gemm_amx_kernel.h"

namespace mixtrain::kernels::cpu {

// Small cache blocks (3 tile steps deep, 3 micro-tiles wide, 2 tall), so that small test shapes already
// cross k, column and row blocks and the padded ends of each.
const GemmBackend kAmxEmulatedBackend = amx::make_backend<64>("amx_emulated", amx::Inputs::kBFloat16, 96, 96);

// The float16 split with the same small blocks (2 source steps, 6 packed).
const GemmBackend kAmxF16EmulatedBackend =
    amx::make_backend<64>("amx_f16_emulated", amx::Inputs::kFloat16Split, 64, 96);

}  // namespace mixtrain::kernels::cpu
