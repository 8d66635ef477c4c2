// Loading cuBLASLt at run time (cublaslt_api.h says why). Done once, by install_backend on a machine with a GPU.
#include <string>
#include <vector>

#include "backend.h"
#include "mixtrain/core/dynamic_library.h"
#include "cublaslt_api.h"

namespace mixtrain::ops::cuda {

namespace {

CublasLtApi api;

// The candidates, best first: the soname of the major version this backend was compiled against (found on the
// loader's path), the same in the toolkit this build used, then an unversioned name (a development install),
// accepted only when its version matches.
std::vector<std::string> candidates() {
  const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  std::vector<std::string> names = {soname};
#ifdef MIXTRAIN_CUDA_LIBRARY_DIR
  names.push_back(std::string(MIXTRAIN_CUDA_LIBRARY_DIR) + "/" + soname);
#endif
  names.push_back("libcublasLt.so");
  return names;
}

}  // namespace

const CublasLtApi& cublaslt() { return api; }

bool load_cublaslt(std::string* why) {
  std::string tried;
  void* lib = open_first_library(candidates(), &tried);
  if (!lib) {
    *why = "cuBLASLt not found (tried " + tried + ")";
    return false;
  }
  std::string missing;
  CublasLtApi a;
  bool ok = resolve_symbol(lib, "cublasLtGetVersion", &a.get_version, &missing);
  ok &= resolve_symbol(lib, "cublasLtCreate", &a.create, &missing);
  ok &= resolve_symbol(lib, "cublasLtDestroy", &a.destroy, &missing);
  ok &= resolve_symbol(lib, "cublasLtGetStatusString", &a.status_string, &missing);
  ok &= resolve_symbol(lib, "cublasLtMatmul", &a.matmul, &missing);
  ok &= resolve_symbol(lib, "cublasLtMatmulDescCreate", &a.desc_create, &missing);
  ok &= resolve_symbol(lib, "cublasLtMatmulDescDestroy", &a.desc_destroy, &missing);
  ok &= resolve_symbol(lib, "cublasLtMatmulDescSetAttribute", &a.desc_set, &missing);
  ok &= resolve_symbol(lib, "cublasLtMatrixLayoutCreate", &a.layout_create, &missing);
  ok &= resolve_symbol(lib, "cublasLtMatrixLayoutDestroy", &a.layout_destroy, &missing);
  ok &= resolve_symbol(lib, "cublasLtMatrixLayoutSetAttribute", &a.layout_set, &missing);
  ok &= resolve_symbol(lib, "cublasLtMatmulPreferenceCreate", &a.pref_create, &missing);
  ok &= resolve_symbol(lib, "cublasLtMatmulPreferenceDestroy", &a.pref_destroy, &missing);
  ok &= resolve_symbol(lib, "cublasLtMatmulPreferenceSetAttribute", &a.pref_set, &missing);
  ok &= resolve_symbol(lib, "cublasLtMatmulAlgoGetHeuristic", &a.heuristic, &missing);
  if (!ok) {
    close_library(lib);
    *why = "cuBLASLt lacks " + missing;
    return false;
  }
  // The enums and the heuristic result's layout are those of the headers' major version.
  const size_t version = a.get_version();
  if (version / 10000 != CUBLAS_VER_MAJOR) {
    close_library(lib);
    *why = "cuBLASLt " + std::to_string(version) + " found, this build needs major version " +
           std::to_string(CUBLAS_VER_MAJOR);
    return false;
  }
  api = a;  // the library stays loaded for the process
  *why = "cuBLASLt " + std::to_string(version);
  return true;
}

}  // namespace mixtrain::ops::cuda
