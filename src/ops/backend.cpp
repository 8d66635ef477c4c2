// The backends' registry: one per device type, the CPU's loaded on first use; the names of the ops; the device
// services' defaults, which say the device cannot do it.
#include "mixtrain/ops/backend.h"

#include <array>
#include <atomic>
#include <string>
#include <vector>


namespace mixtrain::ops {

namespace {
constexpr std::array<const char*, kNumOps> kOpNames = {
#define MIXTRAIN_OP_NAME(member, name) name,
    MIXTRAIN_KERNEL_LIST(MIXTRAIN_OP_NAME)
#undef MIXTRAIN_OP_NAME
};

// Installed backends by device type, read on every op call: atomics, so a read never sees a half-written pointer
// (backends are installed once, before the device is used, or by a test around its own use).
std::array<std::atomic<Backend*>, kNumDeviceTypes>& installed() {
  static std::array<std::atomic<Backend*>, kNumDeviceTypes> backends{};
  return backends;
}
}  // namespace

const char* op_name(Op op) { return kOpNames[static_cast<size_t>(op)]; }

std::vector<Op> all_ops() {
  std::vector<Op> ops;
  for (int i = 0; i < kNumOps; ++i) ops.push_back(static_cast<Op>(i));
  return ops;
}

std::vector<std::string> Backend::op_names() const {
  std::vector<std::string> names;
  for (Op op : all_ops())
    if (kernels_.has(op)) names.emplace_back(op_name(op));
  return names;
}

void Backend::copy(const Tensor&, Tensor&) { fail_unsupported("to_device", Device{type_, 0}); }
void Backend::synchronize(int device_index) { fail_unsupported("synchronize", Device{type_, device_index}); }
void Backend::make_current(int device_index) { fail_unsupported("make_current", Device{type_, device_index}); }
DeviceMemory Backend::memory(int device_index) { fail_unsupported("device_memory", Device{type_, device_index}); }

Backend& cpu_backend() {
  // Never destroyed: kernels may run during static destruction (a tensor freed then still finds its allocator).
  static Backend* cpu = [] {
    Backend* b = cpu::make_cpu_backend();
    installed()[static_cast<size_t>(DeviceType::kCpu)].store(b, std::memory_order_release);
    return b;
  }();
  return *cpu;
}

Backend* find_backend(DeviceType type) {
  if (type == DeviceType::kCpu) return &cpu_backend();
  return installed()[static_cast<size_t>(type)].load(std::memory_order_acquire);
}

Backend& backend_for(const char* op, const Device& device) {
  Backend* b = find_backend(device.type);
  if (b == nullptr) fail_unsupported(op, device);
  return *b;
}

void install_backend(Backend* backend) {
  MIXTRAIN_CHECK(backend != nullptr && backend->type() != DeviceType::kCpu,
                 "install_backend: needs a backend for a device other than the CPU");
  register_allocator(backend->type(), backend->allocator());
  register_device_copy(backend->type(), backend->strided_copy());
  installed()[static_cast<size_t>(backend->type())].store(backend, std::memory_order_release);
}

void uninstall_backend(DeviceType type) {
  MIXTRAIN_CHECK(type != DeviceType::kCpu, "uninstall_backend: the CPU backend stays");
  installed()[static_cast<size_t>(type)].store(nullptr, std::memory_order_release);
  register_device_copy(type, nullptr);
  register_allocator(type, nullptr);
}

}  // namespace mixtrain::ops
