// Which NVIDIA GPUs this machine has, asked of the CUDA driver loaded at run time (dlopen), so mixtrain
// needs no CUDA at build time and runs the same on machines without one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mixtrain::kernels {

struct GpuInfo {
  std::string name;                // e.g. "NVIDIA H200"
  int64_t memory_bytes = 0;        // total device memory
  int cc_major = 0, cc_minor = 0;  // compute capability, e.g. 9.0
};

struct GpuProbe {
  bool driver_found = false;  // the driver library loaded and has the functions below
  // One line for people: "no GPU (CUDA driver not found)", "no GPU (cuInit failed: CUDA_ERROR_NO_DEVICE ...)",
  // "1 GPU (CUDA driver 12.4)".
  std::string status;
  std::vector<GpuInfo> gpus;
};

// Loads driver_library and asks it for every device: cuInit, cuDeviceGetCount, cuDeviceGet, cuDeviceGetName,
// cuDeviceTotalMem_v2, cuDeviceGetAttribute (compute capability). Never throws and never fails: a missing
// library, a missing function or a CUDA error is reported in status, with the GPUs found so far.
// Once cuInit succeeded the library stays loaded (the driver keeps threads of its own).
GpuProbe probe_gpus(const char* driver_library = "libcuda.so.1");

// Tensor cores for float16 arrived with compute capability 7.0 (Volta).
bool gpu_has_fast_float16(const GpuInfo& gpu);
// bfloat16 arithmetic and tensor cores need compute capability 8.0 (Ampere).
bool gpu_has_bfloat16(const GpuInfo& gpu);

}  // namespace mixtrain::kernels
