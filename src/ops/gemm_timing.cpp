// The timed square GEMMs of `bench gemm` and the doctor (ops/gemm_timing.h).
#include "mixtrain/ops/gemm_timing.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "mixtrain/core/random.h"
#include "mixtrain/kernels/gemm.h"
#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/cuda_backend.h"
#include "mixtrain/ops/matmul.h"
#include "mixtrain/ops/transfer.h"

#ifdef MIXTRAIN_HAVE_CUDA
#include "cuda/backend.h"
#endif

namespace mixtrain::ops {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A batch long enough that a GPU's per-product launch and descriptor cost (tens of microseconds on the host)
// overlaps the products before it, short enough that a fraction of a second holds several batches.
constexpr double kBatchSeconds = 0.01;
constexpr int kMaxPerBatch = 1000;
// The CPU's runs of one product: enough for a best-of over a second of small products.
constexpr int kMaxCpuRuns = 1000;

// (n, n) uniform in [-1, 1), drawn in float32 on the host and rounded once into dtype there, then copied.
Tensor random_operand(int64_t n, DType dtype, uint64_t seed, const Device& device) {
  Rng r(seed);
  Tensor t = Tensor::empty({n, n}, DType::kFloat32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < n * n; ++i) p[i] = r.uniform(-1, 1);
  return to_device(t.to(dtype), device);
}

}  // namespace

std::string gemm_device_problem(const Device& device) {
  if (device.is_cpu()) return "";
  const CudaBackendStatus s = load_cuda_backend();
  if (!s.compiled || !s.loaded) return s.detail;
  if (device.index >= s.device_count)
    return device.str() + " does not exist: the CUDA runtime sees " + std::to_string(s.device_count) +
           (s.device_count == 1 ? " GPU (cuda:0)" : " GPUs (cuda:0 to cuda:" + std::to_string(s.device_count - 1) + ")");
  if (!supports<Op::bmm>(DeviceType::kCuda)) return "matmul has no CUDA kernel here (" + s.detail + ")";
  return "";
}

std::string gemm_method(const Device& device, DType dtype) {
  if (device.is_cpu())
    return dtype == DType::kBFloat16 ? kernels::gemm_bf16_method()
           : dtype == DType::kFloat16 ? kernels::gemm_f16_method()
                                      : kernels::gemm_isa();
#ifdef MIXTRAIN_HAVE_CUDA
  return cuda::gemm_method(dtype);
#else
  return "none";
#endif
}

GemmTiming time_matmul(const Device& device, DType dtype, int64_t n, double seconds, uint64_t seed) {
  const std::string problem = gemm_device_problem(device);
  if (!problem.empty())
    MIXTRAIN_FAIL(kInvalidInput, "no GEMM on " << device.str() << ": " << problem,
                  "cpu runs everywhere; a GPU needs a build with the CUDA backend (-DMIXTRAIN_CUDA=ON) and an NVIDIA "
                  "GPU with its driver");
  MIXTRAIN_CHECK(n >= 1, "time_matmul: n must be positive, got " << n);
  MIXTRAIN_CHECK(is_float(dtype), "time_matmul: " << dtype_name(dtype) << " is not a floating dtype");
  MIXTRAIN_CHECK(seconds > 0 && seconds <= 3600, "time_matmul: seconds must be in (0, 3600], got " << seconds);
  GemmTiming t;
  t.device = device;
  t.dtype = dtype;
  t.n = n;
  t.method = gemm_method(device, dtype);
  t.a = random_operand(n, dtype, seed, device);      // (n, n)
  t.b = random_operand(n, dtype, seed + 1, device);  // (n, n)

  // Untimed: cuBLASLt's handle and workspace, the output's first allocation, the CPU's threads and buffers.
  t.c = matmul(t.a, t.b);  // (n, n) in dtype
  synchronize(device);
  auto start = Clock::now();
  t.c = matmul(t.a, t.b);
  synchronize(device);
  const double one = std::max(seconds_since(start), 1e-7);
  t.per_batch = static_cast<int>(std::clamp(std::floor(std::min(kBatchSeconds, seconds / 4) / one), 1.0,
                                            static_cast<double>(kMaxPerBatch)));

  double best = std::numeric_limits<double>::infinity();
  start = Clock::now();
  while (t.batches < 2 || seconds_since(start) < seconds) {
    synchronize(device);
    const auto t0 = Clock::now();
    for (int i = 0; i < t.per_batch; ++i) t.c = matmul(t.a, t.b);
    synchronize(device);
    best = std::min(best, seconds_since(t0) / t.per_batch);
    ++t.batches;
  }
  t.best_seconds = best;
  t.gflops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / best / 1e9;
  return t;
}

double time_cpu_matmul_once(const Tensor& a, const Tensor& b, Tensor& c) {
  const int64_t n = a.defined() && a.rank() == 2 ? a.dim(0) : 0;
  for (const Tensor* t : {&a, &b, static_cast<const Tensor*>(&c)}) {
    MIXTRAIN_CHECK(t->defined() && t->device().is_cpu() && t->rank() == 2 && t->dim(0) == n && t->dim(1) == n &&
                       t->is_contiguous() && t->dtype() == a.dtype() && is_float(t->dtype()) && n >= 1,
                   "time_cpu_matmul_once: the operands must be (n, n), contiguous, of one floating dtype, in host "
                   "memory; got " << (t->defined() ? t->describe() : std::string("an undefined tensor")));
  }
  const DType dtype = a.dtype();
  const auto t0 = Clock::now();
  kernels::gemm(false, false, n, n, n, dtype, a.raw(), n, b.raw(), n, dtype, c.raw(), n, false, nullptr);
  return seconds_since(t0);
}

GemmTiming time_cpu_matmul(const Tensor& a, const Tensor& b, Tensor& c, double seconds) {
  MIXTRAIN_CHECK(seconds > 0 && seconds <= 3600, "time_cpu_matmul: seconds must be in (0, 3600], got " << seconds);
  GemmTiming t;
  t.device = Device::cpu();
  t.dtype = a.defined() ? a.dtype() : DType::kFloat32;
  t.n = a.defined() && a.rank() == 2 ? a.dim(0) : 0;
  t.method = gemm_method(t.device, t.dtype);
  t.per_batch = 1;
  double best = std::numeric_limits<double>::infinity();
  const auto start = Clock::now();
  while (t.batches < 2 || (seconds_since(start) < seconds && t.batches < kMaxCpuRuns)) {
    best = std::min(best, time_cpu_matmul_once(a, b, c));
    ++t.batches;
  }
  const double n = static_cast<double>(t.n);
  t.best_seconds = best;
  t.gflops = 2.0 * n * n * n / best / 1e9;
  return t;
}

}  // namespace mixtrain::ops
