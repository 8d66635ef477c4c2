#include "mixtrain/kernels/gpu_probe.h"

#include <dlfcn.h>

#include <cstddef>
#include <string>

namespace mixtrain::kernels {
namespace {

// The few driver API types we need, spelled as in cuda.h (CUresult and CUdevice are ints there).
using CUresult = int;
using CUdevice = int;
constexpr CUresult kCudaSuccess = 0;
constexpr int kAttrComputeCapabilityMajor = 75;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kAttrComputeCapabilityMinor = 76;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR

struct Driver {
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*device_get_count)(int*) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*device_get_name)(char*, int, CUdevice) = nullptr;
  CUresult (*device_total_mem)(size_t*, CUdevice) = nullptr;
  CUresult (*device_get_attribute)(int*, int, CUdevice) = nullptr;
  // Optional: only make messages nicer.
  CUresult (*driver_get_version)(int*) = nullptr;
  CUresult (*get_error_name)(CUresult, const char**) = nullptr;
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;
};

template <typename F>
bool load(void* lib, const char* symbol, F* fn) {
  *fn = reinterpret_cast<F>(dlsym(lib, symbol));
  return *fn != nullptr;
}

// "CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)", or the number when the driver cannot name it.
std::string error_text(const Driver& d, CUresult code) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.get_error_name == nullptr || d.get_error_name(code, &name) != kCudaSuccess || name == nullptr)
    return "CUDA error " + std::to_string(code);
  std::string out = name;
  if (d.get_error_string != nullptr && d.get_error_string(code, &text) == kCudaSuccess && text != nullptr)
    out += std::string(" (") + text + ")";
  return out;
}

std::string plural_gpus(size_t n) { return std::to_string(n) + (n == 1 ? " GPU" : " GPUs"); }

}  // namespace

GpuProbe probe_gpus(const char* driver_library) {
  GpuProbe out;
  void* lib = driver_library != nullptr ? dlopen(driver_library, RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (lib == nullptr) {
    out.status = "no GPU (CUDA driver not found)";
    return out;
  }
  Driver d;
  const char* missing = nullptr;
  if (!load(lib, "cuInit", &d.init))
    missing = "cuInit";
  else if (!load(lib, "cuDeviceGetCount", &d.device_get_count))
    missing = "cuDeviceGetCount";
  else if (!load(lib, "cuDeviceGet", &d.device_get))
    missing = "cuDeviceGet";
  else if (!load(lib, "cuDeviceGetName", &d.device_get_name))
    missing = "cuDeviceGetName";
  else if (!load(lib, "cuDeviceTotalMem_v2", &d.device_total_mem))
    missing = "cuDeviceTotalMem_v2";
  else if (!load(lib, "cuDeviceGetAttribute", &d.device_get_attribute))
    missing = "cuDeviceGetAttribute";
  if (missing != nullptr) {
    dlclose(lib);
    out.status = std::string("no GPU (the CUDA driver ") + driver_library + " lacks " + missing +
                 "; it is too old or not NVIDIA's)";
    return out;
  }
  load(lib, "cuDriverGetVersion", &d.driver_get_version);
  load(lib, "cuGetErrorName", &d.get_error_name);
  load(lib, "cuGetErrorString", &d.get_error_string);
  out.driver_found = true;

  // Left loaded from here on: unloading a driver that has started its threads is not safe.
  if (const CUresult r = d.init(0); r != kCudaSuccess) {
    out.status = "no GPU (cuInit failed: " + error_text(d, r) + ")";
    return out;
  }
  std::string version;
  int v = 0;
  if (d.driver_get_version != nullptr && d.driver_get_version(&v) == kCudaSuccess && v > 0)
    version = "CUDA driver " + std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  else
    version = "CUDA driver";

  int count = 0;
  if (const CUresult r = d.device_get_count(&count); r != kCudaSuccess) {
    out.status = "no GPU (cuDeviceGetCount failed: " + error_text(d, r) + ")";
    return out;
  }
  if (count <= 0) {
    out.status = "no GPU (" + version + " found, but it reports no devices)";
    return out;
  }
  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    GpuInfo g;
    char name[256] = {};
    size_t bytes = 0;
    const char* step = "cuDeviceGet";
    CUresult r = d.device_get(&dev, i);
    if (r == kCudaSuccess) {
      step = "cuDeviceGetName";
      r = d.device_get_name(name, static_cast<int>(sizeof(name) - 1), dev);
    }
    if (r == kCudaSuccess) {
      step = "cuDeviceTotalMem_v2";
      r = d.device_total_mem(&bytes, dev);
    }
    if (r == kCudaSuccess) {
      step = "cuDeviceGetAttribute";
      r = d.device_get_attribute(&g.cc_major, kAttrComputeCapabilityMajor, dev);
    }
    if (r == kCudaSuccess) r = d.device_get_attribute(&g.cc_minor, kAttrComputeCapabilityMinor, dev);
    if (r != kCudaSuccess) {
      out.status = plural_gpus(out.gpus.size()) + " usable of " + std::to_string(count) + " (" + step +
                   " failed for device " + std::to_string(i) + ": " + error_text(d, r) + ")";
      return out;
    }
    g.name = name;
    g.memory_bytes = static_cast<int64_t>(bytes);
    out.gpus.push_back(std::move(g));
  }
  out.status = plural_gpus(out.gpus.size()) + " (" + version + ")";
  return out;
}

bool gpu_has_fast_float16(const GpuInfo& gpu) { return gpu.cc_major >= 7; }

bool gpu_has_bfloat16(const GpuInfo& gpu) { return gpu.cc_major >= 8; }

}  // namespace mixtrain::kernels
