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

// Loads the driver's functions into d: nullptr when it has every one probe_gpus needs (the optional ones are loaded
// when present), else the name of the first one it lacks.
const char* load_driver(void* lib, Driver& d) {
  if (!load(lib, "cuInit", &d.init)) return "cuInit";
  if (!load(lib, "cuDeviceGetCount", &d.device_get_count)) return "cuDeviceGetCount";
  if (!load(lib, "cuDeviceGet", &d.device_get)) return "cuDeviceGet";
  if (!load(lib, "cuDeviceGetName", &d.device_get_name)) return "cuDeviceGetName";
  if (!load(lib, "cuDeviceTotalMem_v2", &d.device_total_mem)) return "cuDeviceTotalMem_v2";
  if (!load(lib, "cuDeviceGetAttribute", &d.device_get_attribute)) return "cuDeviceGetAttribute";
  load(lib, "cuDriverGetVersion", &d.driver_get_version);
  load(lib, "cuGetErrorName", &d.get_error_name);
  load(lib, "cuGetErrorString", &d.get_error_string);
  return nullptr;
}

// "CUDA driver 12.4", or "CUDA driver" when it does not say its version.
std::string driver_version(const Driver& d) {
  int v = 0;
  if (d.driver_get_version != nullptr && d.driver_get_version(&v) == kCudaSuccess && v > 0)
    return "CUDA driver " + std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  return "CUDA driver";
}

// Asks the driver for device i's name, memory and compute capability, into g. On an error returns it and sets
// *step to the call that failed.
CUresult query_gpu(const Driver& d, int i, GpuInfo& g, const char** step) {
  CUdevice dev = 0;
  char name[256] = {};
  size_t bytes = 0;
  *step = "cuDeviceGet";
  CUresult r = d.device_get(&dev, i);
  if (r == kCudaSuccess) {
    *step = "cuDeviceGetName";
    r = d.device_get_name(name, static_cast<int>(sizeof(name) - 1), dev);
  }
  if (r == kCudaSuccess) {
    *step = "cuDeviceTotalMem_v2";
    r = d.device_total_mem(&bytes, dev);
  }
  if (r == kCudaSuccess) {
    *step = "cuDeviceGetAttribute";
    r = d.device_get_attribute(&g.cc_major, kAttrComputeCapabilityMajor, dev);
  }
  if (r == kCudaSuccess) r = d.device_get_attribute(&g.cc_minor, kAttrComputeCapabilityMinor, dev);
  if (r != kCudaSuccess) return r;
  g.name = name;
  g.memory_bytes = static_cast<int64_t>(bytes);
  return kCudaSuccess;
}

}  // namespace

GpuProbe probe_gpus(const char* driver_library) {
  GpuProbe out;
  void* lib = driver_library != nullptr ? dlopen(driver_library, RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (lib == nullptr) {
    out.status = "no GPU (CUDA driver not found)";
    return out;
  }
  Driver d;
  if (const char* missing = load_driver(lib, d); missing != nullptr) {
    dlclose(lib);
    out.status = std::string("no GPU (the CUDA driver ") + driver_library + " lacks " + missing +
                 "; it is too old or not NVIDIA's)";
    return out;
  }
  out.driver_found = true;

  // Left loaded from here on: unloading a driver that has started its threads is not safe.
  if (const CUresult r = d.init(0); r != kCudaSuccess) {
    out.status = "no GPU (cuInit failed: " + error_text(d, r) + ")";
    return out;
  }
  const std::string version = driver_version(d);
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
    GpuInfo g;
    const char* step = nullptr;
    if (const CUresult r = query_gpu(d, i, g, &step); r != kCudaSuccess) {
      out.status = plural_gpus(out.gpus.size()) + " usable of " + std::to_string(count) + " (" + step +
                   " failed for device " + std::to_string(i) + ": " + error_text(d, r) + ")";
      return out;
    }
    out.gpus.push_back(std::move(g));
  }
  out.status = plural_gpus(out.gpus.size()) + " (" + version + ")";
  return out;
}

bool gpu_has_fast_float16(const GpuInfo& gpu) { return gpu.cc_major >= 7; }

bool gpu_has_bfloat16(const GpuInfo& gpu) { return gpu.cc_major >= 8; }

}  // namespace mixtrain::kernels
