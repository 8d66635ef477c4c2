// Timing the GEMM behind ops::matmul, for `mixtrain bench gemm` and `mixtrain doctor`: the one place that times
// GEMMs. On a device (`bench gemm --device`, the doctor's GPU lines) The products go through the op entry and the device's kernel table (on a GPU the CUDA backend's cuBLASLt
// kernel), as a training step's do, and the host clock is read between two ops::synchronize() calls, so queued
// GPU work is counted where it runs. No CUDA type appears here.
#pragma once

#include <cstdint>
#include <string>

#include "mixtrain/core/tensor.h"

namespace mixtrain::ops {

struct GemmTiming {
  Device device;
  DType dtype = DType::kFloat32;
  int64_t n = 0;
  int batches = 0;          // timed batches; the fastest counts
  int per_batch = 0;        // products run back to back in each batch
  double best_seconds = 0;  // per product, in the fastest batch
  double gflops = 0;        // 2 n^3 / best_seconds / 1e9
  std::string method;       // how the device computes it: "cublaslt" (GPU), or the CPU GEMM's method
  Tensor a, b, c;           // (n, n) each, in dtype, on device: the operands (uniform in [-1, 1)) and the last product
};

// Why `device` cannot run the timed GEMM (no CUDA backend in this build, no usable GPU, no such index, no
// cuBLASLt), in words for an error message; empty when it can. The CPU always can.
std::string gemm_device_problem(const Device& device);

// How `device` multiplies dtype inputs: "cublaslt" on a GPU ("cublaslt tf32" for float32 under
// MIXTRAIN_CUDA_TF32=1), kernels::gemm's method on the CPU ("avx512", "amx", ...).
std::string gemm_method(const Device& device, DType dtype);

// Times C (n, n) = A (n, n) x B (n, n), inputs and C in dtype, float32 accumulation, through ops::matmul on
// device: one untimed product (handles, workspace, the output's memory), then batches of back-to-back products
// (each batch about 10 ms, so a GPU's launch cost overlaps its work) for about `seconds`, at least two batches.
// Error (kInvalidInput) naming the device when gemm_device_problem() is not empty, or for n < 1, a dtype that is
// not floating, or seconds outside (0, 3600].
GemmTiming time_matmul(const Device& device, DType dtype, int64_t n, double seconds, uint64_t seed = 1);

// One timed product C = A x B on the CPU, on the caller's operands: A, B and C (n, n), contiguous, in one floating
// dtype, in host memory, C written in place. The CPU GEMM behind ops::matmul (kernels::gemm, its method chosen as
// gemm_method() says) runs on their buffers between two reads of the host clock, with nothing allocated, so the
// same operands time run after run. Returns the wall seconds. Error (kInvalidInput) on operands that do not fit.
double time_cpu_matmul_once(const Tensor& a, const Tensor& b, Tensor& c);

// time_cpu_matmul_once repeated for about `seconds` (at least two runs, at most 1,000): batches of one product,
// best_seconds the fastest, gflops 2 n^3 / best_seconds / 1e9. The operands stay the caller's (a, b and c are left
// undefined in the result).
GemmTiming time_cpu_matmul(const Tensor& a, const Tensor& b, Tensor& c, double seconds);

}  // namespace mixtrain::ops
