// The CUDA backend's public entry (mixtrain/ops/cuda_backend.h) in a build with it: the loader, installed once, and
// the GEMM's counts.
#include "backend.h"
#include "gemm_fallback.h"
#include "gemm_plan_cache.h"
#include "mixtrain/ops/cuda_backend.h"

namespace mixtrain::ops {

// The public entry (mixtrain/ops/cuda_backend.h) of a build with the backend: installs it once.
CudaBackendStatus load_cuda_backend() {
  static const CudaBackendStatus status = cuda::install_backend();
  return status;
}

CudaGemmCounts cuda_gemm_counts() {
  CudaGemmCounts c;
  for (cuda::GemmEpilogue e : cuda::kGemmEpilogues) c.declined_plans += cuda::gemm_plans_declined(e);
  c.fallback_products = cuda::gemm_fallback_products();
  return c;
}

}  // namespace mixtrain::ops
