// Hooks of the kernels layer that only its tests use.
#pragma once

namespace mixtrain::kernels {

// Forces the GEMM path ("scalar", "avx2" or "avx512"), never above what this CPU supports, so tests can
// run every path in one process; nullptr returns to the default (MIXTRAIN_ISA, else the best path).
// Returns gemm_isa() afterwards, which callers compare to what they asked for to see if the CPU has it.
const char* set_gemm_isa_for_testing(const char* isa);

// Forces the bfloat16 method ("amx", "dot", "widen" or "amx_emulated"; amx and dot only where the CPU
// and the path in use can run them), over MIXTRAIN_BF16_GEMM and the calibration; nullptr returns to the
// default. Returns gemm_bf16_method(), which callers compare to what they asked for.
const char* set_gemm_bf16_method_for_testing(const char* method);

// Forces the float16 method ("amx", "fp16", "widen", "amx_emulated" or "fp16_emulated"; amx and fp16 only
// where the CPU and the path in use can run them), over MIXTRAIN_F16_GEMM and the calibration, for products of
// every shape; nullptr returns to the default. Returns gemm_f16_method().
const char* set_gemm_f16_method_for_testing(const char* method);

// Forces the float16 promotion interval (k values, even, 2..1024); 0 returns to the default. Returns
// gemm_f16_promote_interval().
int set_gemm_f16_promote_interval_for_testing(int k_values);

// Turns the column kernels (the AMX paths' run of several row tiles against one B panel in slices) off or back
// on, so tests can check that they give the bits of one tile at a time. Returns the previous setting.
bool set_gemm_column_kernel_for_testing(bool enabled);

}  // namespace mixtrain::kernels
