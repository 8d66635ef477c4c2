// Loading cuBLASLt at run time (cublaslt_api.h says why). Done once, by install_backend on a machine with a GPU.
#include <dlfcn.h>

#include <string>
#include <vector>

#include "backend.h"
#include "cublaslt_api.h"

namespace mixtrain::ops::cuda {

namespace {

CublasLtApi api;

template <typename Fn>
bool resolve(void* lib, const char* name, Fn* fn, std::string* missing) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*fn == nullptr && missing->empty()) *missing = name;
  return *fn != nullptr;
}

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
  void* lib = nullptr;
  std::string tried;
  for (const std::string& name : candidates()) {
    lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib) break;
    tried += (tried.empty() ? "" : ", ") + name;
  }
  if (!lib) {
    *why = "cuBLASLt not found (tried " + tried + ")";
    return false;
  }
  std::string missing;
  CublasLtApi a;
  bool ok = resolve(lib, "cublasLtGetVersion", &a.get_version, &missing);
  ok &= resolve(lib, "cublasLtCreate", &a.create, &missing);
  ok &= resolve(lib, "cublasLtDestroy", &a.destroy, &missing);
  ok &= resolve(lib, "cublasLtGetStatusString", &a.status_string, &missing);
  ok &= resolve(lib, "cublasLtMatmul", &a.matmul, &missing);
  ok &= resolve(lib, "cublasLtMatmulDescCreate", &a.desc_create, &missing);
  ok &= resolve(lib, "cublasLtMatmulDescDestroy", &a.desc_destroy, &missing);
  ok &= resolve(lib, "cublasLtMatmulDescSetAttribute", &a.desc_set, &missing);
  ok &= resolve(lib, "cublasLtMatrixLayoutCreate", &a.layout_create, &missing);
  ok &= resolve(lib, "cublasLtMatrixLayoutDestroy", &a.layout_destroy, &missing);
  ok &= resolve(lib, "cublasLtMatrixLayoutSetAttribute", &a.layout_set, &missing);
  ok &= resolve(lib, "cublasLtMatmulPreferenceCreate", &a.pref_create, &missing);
  ok &= resolve(lib, "cublasLtMatmulPreferenceDestroy", &a.pref_destroy, &missing);
  ok &= resolve(lib, "cublasLtMatmulPreferenceSetAttribute", &a.pref_set, &missing);
  ok &= resolve(lib, "cublasLtMatmulAlgoGetHeuristic", &a.heuristic, &missing);
  if (!ok) {
    dlclose(lib);
    *why = "cuBLASLt lacks " + missing;
    return false;
  }
  // The enums and the heuristic result's layout are those of the headers' major version.
  const size_t version = a.get_version();
  if (version / 10000 != CUBLAS_VER_MAJOR) {
    dlclose(lib);
    *why = "cuBLASLt " + std::to_string(version) + " found, this build needs major version " +
           std::to_string(CUBLAS_VER_MAJOR);
    return false;
  }
  api = a;  // the library stays loaded for the process
  *why = "cuBLASLt " + std::to_string(version);
  return true;
}

}  // namespace mixtrain::ops::cuda
