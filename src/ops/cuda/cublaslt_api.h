// cuBLASLt, loaded at run time: the handful of functions the GEMM uses (matmul.cpp), resolved with dlsym from
// libcublasLt.so.13. Linking it would add a few hundred megabytes of dependency to every binary of the library,
// GPU or not; loaded, it costs nothing until a GPU is present, and its absence only keeps matmul on the CPU.
// Types come from cublasLt.h (private to the backend), so every pointer has the library's own signature.
#pragma once

#include <cublasLt.h>

namespace mixtrain::ops::cuda {

struct CublasLtApi {
  decltype(&::cublasLtCreate) create = nullptr;
  decltype(&::cublasLtDestroy) destroy = nullptr;
  decltype(&::cublasLtGetVersion) get_version = nullptr;
  decltype(&::cublasLtGetStatusString) status_string = nullptr;
  decltype(&::cublasLtMatmul) matmul = nullptr;
  decltype(&::cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&::cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&::cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&::cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&::cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&::cublasLtMatrixLayoutSetAttribute) layout_set = nullptr;
  decltype(&::cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&::cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
};

// The loaded functions; only valid after load_cublaslt() (backend.h) returned true.
const CublasLtApi& cublaslt();

// A GPU's cuBLASLt handle and workspace (matmul.cpp's, made on first use and kept for the process), for the files
// that build their own cuBLASLt calls (fp8_matmul.cu). Work on the legacy default stream is ordered, so they share it.
struct CublasLtContext {
  cublasLtHandle_t handle;
  void* workspace;
  size_t workspace_bytes;
};
CublasLtContext cublaslt_context(int device);

}  // namespace mixtrain::ops::cuda
