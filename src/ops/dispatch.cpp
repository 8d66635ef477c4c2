#include "mixtrain/ops/dispatch.h"

#include <atomic>

namespace mixtrain::ops {

namespace {
std::atomic<unsigned> g_emulated{0};  // bit per device type
unsigned bit(DeviceType type) { return 1u << static_cast<unsigned>(type); }
}  // namespace

void emulate_with_cpu_kernels(DeviceType type, bool on) {
  if (on)
    g_emulated.fetch_or(bit(type));
  else
    g_emulated.fetch_and(~bit(type));
}

bool emulated_with_cpu_kernels(DeviceType type) { return (g_emulated.load(std::memory_order_relaxed) & bit(type)) != 0; }

namespace {
// Process-wide, not per thread: a CPU kernel forks OpenMP workers that address the tensors too. A test drives the
// emulated device from one host thread, so while a kernel runs no other host code does.
std::atomic<int> g_emulated_kernel_depth{0};
}  // namespace

bool in_emulated_kernel() { return g_emulated_kernel_depth.load(std::memory_order_acquire) > 0; }
EmulatedKernelScope::EmulatedKernelScope() { g_emulated_kernel_depth.fetch_add(1, std::memory_order_acq_rel); }
EmulatedKernelScope::~EmulatedKernelScope() { g_emulated_kernel_depth.fetch_sub(1, std::memory_order_acq_rel); }

void fail_unsupported(const char* op, const Device& device) {
  MIXTRAIN_FAIL(kInvalidInput, op << ": no kernel for device " << device.str(),
                "this build's backends do not implement it there; run on the cpu device");
}

Device common_device(const char* op, std::initializer_list<const Tensor*> inputs) {
  const Tensor* first = nullptr;
  for (const Tensor* t : inputs) {
    if (!t || !t->defined()) continue;
    if (!first) {
      first = t;
      continue;
    }
    MIXTRAIN_CHECK(t->device() == first->device(), op << ": inputs are on different devices: " << first->describe()
                                                      << " and " << t->describe());
  }
  return first ? first->device() : Device::cpu();
}

}  // namespace mixtrain::ops
