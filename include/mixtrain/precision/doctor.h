// `mixtrain doctor`: what this machine can do, and which dtype policy pays off on it. The CPU verdicts
// come from timing mixtrain's own GEMM in each compute dtype, not from a feature list: a CPU may have
// bfloat16 instructions that the kernels do not use, or convert 16-bit inputs so cheaply that they win
// on memory traffic alone.
//
// Verdict rules (CPU):
//   float32 is always "baseline".
//   A mixed policy is "recommended (<dtype> GEMM measured Rx float32)" when its measured speedup R (shown
//   with two decimals, and compared as shown) is >= kRecommendSpeedup, else
//   "no benefit on this hardware: stay in float32 (<dtype> GEMM measured Rx float32)".
//   On a busy machine (DoctorReport::busy(): other programs took the GEMM threads' time), a recommendation for a
//   dtype whose GEMM has no 16-bit arithmetic here (its inputs widened to float32 for float32 FMAs) is withheld:
//   "inconclusive on a busy machine: stay in float32 until measured on an idle one (<dtype> GEMM measured Rx
//   float32)". Contention skews the float32 and 16-bit runs differently, so such a ratio can clear the threshold
//   from noise alone; a 16-bit method (AMX, AVX512-FP16, AVX512-BF16 dot products) keeps its measured verdict.
//   16-bit activations also halve the bytes of memory-bound layers; the reason line says so, but the
//   verdict rests on the GEMM, where training time goes.
// GPUs: where the CUDA backend is built and loaded and has its GEMM (cuBLASLt), each GPU's float32, float16 and
// bfloat16 GEMM is timed the same way (n = kGpuGemmSize, through ops::matmul, ops::time_matmul) and a mixed
// policy gets measured_verdict() from its ratio, as on the CPU. A dtype the compute capability lacks (float16
// tensor cores need >= 7.0, bfloat16 >= 8.0) is "unsupported" and not timed; a GPU that cannot be measured (no
// backend, no GPU the runtime can use, a failed measurement) gets lines from its compute capability alone:
// "recommended (float16 tensor cores, compute capability 9.0)", with the reason it was not measured.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/core/dtype.h"
#include "mixtrain/core/json.h"
#include "mixtrain/kernels/gpu_probe.h"
#include "mixtrain/ops/cuda_backend.h"

namespace mixtrain {

// A mixed policy is recommended from this GEMM speedup over float32 on: below it, the gain is within the
// noise of a shared machine and does not pay for 16-bit rounding (and loss scaling, for float16).
constexpr double kRecommendSpeedup = 1.15;

// Each GPU's GEMMs are timed at this n, for about kGpuGemmSeconds per dtype (on top of the CPU's budget): long
// enough for a GPU's clocks and cuBLASLt's heuristic, short beside the CPU measurement.
constexpr int64_t kGpuGemmSize = 4096;
constexpr double kGpuGemmSeconds = 0.25;

// Below this share of its threads' time (DoctorReport::cpu_share), the measurement is flagged as noisy.
constexpr double kBusyCpuShare = 0.8;

struct CpuFeatureFlag {
  const char* label;  // as people write it: "AVX512-FP16"
  const char* key;    // as /proc/cpuinfo writes it: "avx512_fp16"
  bool present;
};

struct CpuReport {
  std::string model_name;  // brand string, or "unknown CPU"
  std::string vendor;
  int logical_cores = 1;  // logical processors this process may run on
  int gemm_threads = 1;   // threads the GEMM uses (OpenMP)
  std::string gemm_isa;   // "avx512", "avx2" or "scalar"
  std::string bf16_method;  // how bfloat16 GEMMs compute here: "amx", "dot" or "widen" (gemm_bf16_method())
  std::string f16_method;   // how float16 GEMMs compute here: "fp16" or "widen" (gemm_f16_method())
  int f16_interval = 0;     // k values per float16 partial sum on the "fp16" method
  bool amx_granted = false;  // whether the OS granted the AMX tile state
  std::string amx_status;    // "granted", or why AMX is not used (gemm_amx_status())
  // AVX2, FMA, F16C, AVX-512F, AVX512-FP16, AVX512-BF16, AMX-BF16, AMX-FP16, in that order.
  std::vector<CpuFeatureFlag> features;
};

// One timed square GEMM: C (n, n) = A (n, n) x B (n, n), A, B and C all in `dtype`, float32 accumulation.
struct GemmMeasurement {
  DType dtype = DType::kFloat32;
  int64_t size = 0;         // n
  int repetitions = 0;      // timed runs; the best one counts
  double best_seconds = 0;  // fastest run, per product
  double gflops = 0;        // 2 n^3 / best_seconds / 1e9
  double ratio = 0;         // gflops / float32 gflops at the same size (1 for float32)
  int per_run = 1;          // products per timed run (a GPU's run is a batch of back-to-back products)
};

// One GPU's GEMM measurement (gpuN is the CUDA runtime's cuda:N).
struct GpuGemmReport {
  std::string device;                         // "gpu0"
  std::string method;                         // how it multiplies: "cublaslt" (ops::gemm_method)
  std::vector<GemmMeasurement> measurements;  // float32, then the 16-bit dtypes the GPU has; empty: not measured
  std::string not_measured;                   // why a dtype or the whole GPU was not measured; empty when all were
};

struct PolicyVerdict {
  std::string device;   // "cpu", or "gpu0", "gpu1", ...
  std::string policy;   // "float32", "mixed_float16", "mixed_bfloat16"
  std::string verdict;  // "baseline", "recommended (...)", "no benefit on this hardware: ...", "unsupported"
  std::string reason;   // why, in a sentence or two
  double speedup = 0;   // measured GEMM speedup over float32 (0 where not measured)
};

struct DoctorReport {
  CpuReport cpu;
  kernels::GpuProbe gpu;
  ops::CudaBackendStatus cuda_backend;  // whether this build's CUDA backend is there and loaded on this machine
  // NCCL for data-parallel training on GPUs ("multi-GPU" in the text), as the caller found it (distributed's nccl_status(), a layer above this one):
  // "NCCL 2.28.9 (libnccl.so.2)" or why not; empty: not looked for (neither printed nor in the JSON).
  std::string nccl;
  std::vector<GemmMeasurement> measurements;  // by size, then float32, float16, bfloat16
  std::vector<GpuGemmReport> gpu_gemm;        // one per GPU of the probe, in its order
  std::vector<PolicyVerdict> verdicts;        // cpu lines first, then each GPU's
  std::vector<std::string> fp8;               // how the float8 policies run here (fp8_lines)
  double seconds_budget = 0;                  // what was asked for
  double seconds_spent = 0;                   // wall time of the measurement
  // CPU time this process got while the GEMMs ran, over their wall time x GEMM threads: about 1 on an idle
  // machine; well below (see kBusyCpuShare) when other programs competed and the ratios are noisy.
  double cpu_share = 0;
  bool busy() const;  // cpu_share < kBusyCpuShare
};

// Inspects the CPU and the GPUs and times the CPU GEMM for about `seconds` in total (the three dtypes
// interleaved, so a load change on a shared machine hits them alike). At least two rounds of the
// smallest size always run, so a tiny budget may be overrun; a larger size is skipped when it would
// not fit. Each usable GPU's GEMMs take about kGpuGemmSeconds per dtype more (measure_gpu_gemm).
// Throws mixtrain::Error (kInvalidInput) unless 0 < seconds <= 3600.
DoctorReport run_doctor(double seconds = 1.0);

// Times the GEMM of every GPU in `probe` that the loaded CUDA backend can use (see the rules at the top of
// this file); the others' reports say why not. Never throws: a failed measurement is reported in not_measured.
std::vector<GpuGemmReport> measure_gpu_gemm(const kernels::GpuProbe& probe, const ops::CudaBackendStatus& backend);

// The GEMM speedup of `dtype` over float32: geometric mean of its ratios over the measured sizes
// (1 for float32, 0 when there is no measurement of it). The report form reads the CPU's measurements.
double measured_speedup(const std::vector<GemmMeasurement>& measurements, DType dtype);
double measured_speedup(const DoctorReport& report, DType dtype);

// The verdict string for a policy whose compute dtype is `dtype`, given its measured GEMM speedup, on the CPU
// or a GPU; see the rules at the top of this file.
std::string measured_verdict(DType dtype, double speedup);
// The CPU's verdict: measured_verdict, with a recommendation withheld when the measurement ran on a busy machine
// and `sixteen_bit_arithmetic` is false (the GEMM widened this dtype's inputs to float32).
std::string cpu_verdict(DType dtype, double speedup, bool busy, bool sixteen_bit_arithmetic);
// Whether the CPU GEMM multiplies `dtype` (float16 or bfloat16) with 16-bit arithmetic, by its methods (f16: "fp16"
// or "amx"; bf16: "dot" or "amx"), rather than widening the inputs to float32.
bool cpu_gemm_has_16bit_arithmetic(DType dtype, const std::string& f16_method, const std::string& bf16_method);

// The verdict lines of the GPUs in `probe` (three per GPU: float32, mixed_float16, mixed_bfloat16): from the
// measurements in gemm[i] where there are some, else from the compute capability; see the rules at the top of
// this file.
std::vector<PolicyVerdict> gpu_verdicts(const kernels::GpuProbe& probe, const std::vector<GpuGemmReport>& gemm = {});

// How the float8 policies (mixed_float8, mixed_float8_e4m3) run here, one line for the CPU and one per GPU of the
// probe: on the CPU emulated, the FP8 operands widened exactly to bfloat16 and multiplied on the bfloat16 GEMM by
// `bf16_method` ("amx", "dot" or "widen") with float32 accumulation; a GPU of compute capability 8.9 or later has
// FP8 tensor cores (which mixtrain does not drive yet: the float8 policies run on the CPU), an earlier one none.
std::vector<std::string> fp8_lines(const std::string& bf16_method, const kernels::GpuProbe& probe);

// "2.1", "0.93", "1.0": the speedup as it appears in verdicts (two decimals, one trailing zero dropped).
std::string format_speedup(double speedup);

// The report as a JSON object: cpu (with features), gpus (driver_found, status, devices, each with its gemm
// measurements or why not), measurements (the CPU's), verdicts, thresholds, seconds.
Json doctor_to_json(const DoctorReport& report);

// The report as a table for people, ending in a newline.
std::string format_doctor(const DoctorReport& report);

}  // namespace mixtrain
