// A stand-in for the CUDA driver (libcuda.so.1) with two made-up GPUs, so gpu_probe_test can check the whole
// probe on machines without one. MIXTRAIN_FAKE_CUDA selects the behaviour: "ok" (default), "no_device"
// (cuInit fails as on a machine with a driver but no GPU), "bad_attribute" (the second GPU's compute
// capability cannot be read).
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {
constexpr int kSuccess = 0, kInvalidValue = 1, kNoDevice = 100, kInvalidDevice = 101;
constexpr int kDevices = 2;

bool mode_is(const char* mode) {
  const char* env = std::getenv("MIXTRAIN_FAKE_CUDA");
  return env != nullptr && std::strcmp(env, mode) == 0;
}
}  // namespace

extern "C" {

int cuInit(unsigned flags) {
  if (flags != 0) return kInvalidValue;
  return mode_is("no_device") ? kNoDevice : kSuccess;
}

int cuDriverGetVersion(int* version) {
  *version = 12040;
  return kSuccess;
}

int cuDeviceGetCount(int* count) {
  *count = kDevices;
  return kSuccess;
}

int cuDeviceGet(int* device, int ordinal) {
  if (ordinal < 0 || ordinal >= kDevices) return kInvalidDevice;
  *device = ordinal;
  return kSuccess;
}

int cuDeviceGetName(char* name, int len, int device) {
  if (device < 0 || device >= kDevices || len <= 0) return kInvalidValue;
  std::snprintf(name, static_cast<size_t>(len), "%s", device == 0 ? "Fake H200" : "Fake T4");
  return kSuccess;
}

int cuDeviceTotalMem_v2(size_t* bytes, int device) {
  if (device < 0 || device >= kDevices) return kInvalidDevice;
  *bytes = (device == 0 ? size_t{141} : size_t{15}) << 30;
  return kSuccess;
}

int cuDeviceGetAttribute(int* value, int attribute, int device) {
  if (device < 0 || device >= kDevices) return kInvalidDevice;
  if (device == 1 && mode_is("bad_attribute")) return kInvalidValue;
  if (attribute == 75)
    *value = device == 0 ? 9 : 7;  // compute capability major
  else if (attribute == 76)
    *value = device == 0 ? 0 : 5;  // minor
  else
    return kInvalidValue;
  return kSuccess;
}

int cuGetErrorName(int code, const char** name) {
  if (code == kNoDevice)
    *name = "CUDA_ERROR_NO_DEVICE";
  else if (code == kInvalidValue)
    *name = "CUDA_ERROR_INVALID_VALUE";
  else
    return kInvalidValue;
  return kSuccess;
}

int cuGetErrorString(int code, const char** text) {
  if (code == kNoDevice)
    *text = "no CUDA-capable device is detected";
  else if (code == kInvalidValue)
    *text = "invalid argument";
  else
    return kInvalidValue;
  return kSuccess;
}

}  // extern "C"
