// The CPU backend: host memory (core's counting allocator, already registered), plain copies, nothing to wait for,
// and the kernels of src/ops/cpu/, each file registering its own.
#include <fstream>
#include <string>

#include "cpu_backend.h"

namespace mixtrain::ops::cpu {

namespace {
class CpuBackend final : public Backend {
 public:
  CpuBackend() : Backend(DeviceType::kCpu) {
#define MIXTRAIN_CALL_CPU_REGISTRATION(file) register_##file##_kernels(kernels());
    MIXTRAIN_CPU_KERNEL_FILES(MIXTRAIN_CALL_CPU_REGISTRATION)
#undef MIXTRAIN_CALL_CPU_REGISTRATION
  }

  // Host to host: the dtype is the same, so a plain copy.
  void copy(const Tensor& src, Tensor& dst) override { dst.copy_from(src); }
  // CPU kernels return when their work is done.
  void synchronize(int) override {}
  // The host has no current device.
  void make_current(int) override {}
  DeviceMemory memory(int) override {
    DeviceMemory m;
    std::ifstream f("/proc/meminfo");
    std::string key, unit;
    int64_t kib = 0;
    while (f >> key >> kib >> unit) {
      if (key == "MemAvailable:") m.free_bytes = kib * 1024;
      if (key == "MemTotal:") m.total_bytes = kib * 1024;
    }
    return m;
  }
};
}  // namespace

Backend* make_cpu_backend() { return new CpuBackend(); }

}  // namespace mixtrain::ops::cpu
