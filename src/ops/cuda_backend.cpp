// load_cuda_backend() in a build without the CUDA backend: a status that says why. With it (MIXTRAIN_CUDA), the
// backend's own src/ops/cuda/backend.cpp defines these functions.
#include "mixtrain/ops/cuda_backend.h"

#ifndef MIXTRAIN_HAVE_CUDA
namespace mixtrain::ops {

CudaBackendStatus load_cuda_backend() {
  CudaBackendStatus s;
  s.detail = "this build has no CUDA backend (configure with -DMIXTRAIN_CUDA=ON where the CUDA toolkit is installed)";
  return s;
}

CudaGemmCounts cuda_gemm_counts() { return {}; }

}  // namespace mixtrain::ops
#endif
