// load_cuda_backend(): the CUDA backend's entry when the build has it (src/ops/cuda/), a status that says why
// not otherwise.
#include "mixtrain/ops/cuda_backend.h"

#ifdef MIXTRAIN_HAVE_CUDA
#include "cuda/backend.h"
#include "cuda/gemm_fallback.h"
#include "cuda/gemm_plan_cache.h"
#endif

namespace mixtrain::ops {

CudaBackendStatus load_cuda_backend() {
#ifdef MIXTRAIN_HAVE_CUDA
  static const CudaBackendStatus status = cuda::install_backend();
  return status;
#else
  CudaBackendStatus s;
  s.detail = "this build has no CUDA backend (configure with -DMIXTRAIN_CUDA=ON where the CUDA toolkit is installed)";
  return s;
#endif
}

CudaGemmCounts cuda_gemm_counts() {
  CudaGemmCounts c;
#ifdef MIXTRAIN_HAVE_CUDA
  for (cuda::GemmEpilogue e : cuda::kGemmEpilogues) c.declined_plans += cuda::gemm_plans_declined(e);
  c.fallback_products = cuda::gemm_fallback_products();
#endif
  return c;
}

}  // namespace mixtrain::ops
