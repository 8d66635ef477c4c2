// The dispatch seam between ops and backends. Every op entry in ops/ validates its arguments on the
// host, then calls the kernel of its inputs' device through the op's KernelTable: one function pointer
// per device type. The CPU backend (src/ops/cpu/) fills the CPU entries; a GPU backend fills the
// kCuda entries of the same tables when it loads (docs/ARCHITECTURE.md gives the recipe).
// Kernels receive validated, contiguous tensors and preallocated outputs on their device.
#pragma once

#include <array>
#include <utility>
#include <initializer_list>

#include "mixtrain/core/tensor.h"

namespace mixtrain::ops {

[[noreturn]] void fail_unsupported(const char* op, const Device& device);

// An emulated device: a device type whose memory the host addresses, standing in for a GPU in tests, so that the
// code above ops runs device tensors end to end on any machine (the test installs the type's allocator and
// copies). While on, a table without a kernel for that type hands out its CPU kernel; a real backend's kernels
// always take precedence. Off by default.
void emulate_with_cpu_kernels(DeviceType type, bool on);
bool emulated_with_cpu_kernels(DeviceType type);

// Whether an emulated device's kernel is running (the CPU kernel a table handed out for it, with the OpenMP threads
// it forks), the one place host code may address that device's memory; a test's copies enter the scope themselves.
bool in_emulated_kernel();
class EmulatedKernelScope {
 public:
  EmulatedKernelScope();
  ~EmulatedKernelScope();
  EmulatedKernelScope(const EmulatedKernelScope&) = delete;
  EmulatedKernelScope& operator=(const EmulatedKernelScope&) = delete;
};

namespace detail {
// The CPU kernel handed out for an emulated device, called inside an EmulatedKernelScope. target is set by
// KernelTable just before the caller calls the thunk (table(device)(args...)).
template <typename Fn>
struct EmulatedThunk;
template <typename R, typename... Args>
struct EmulatedThunk<R(Args...)> {
  static inline thread_local R (*target)(Args...) = nullptr;
  static R call(Args... args) {
    R (*fn)(Args...) = target;
    EmulatedKernelScope scope;
    return fn(std::forward<Args>(args)...);
  }
};
}  // namespace detail

template <typename Fn>
class KernelTable {
 public:
  // op names the operation in errors; cpu is the CPU backend's kernel (may be null).
  KernelTable(const char* op, Fn* cpu) : op_(op) { fns_[static_cast<size_t>(DeviceType::kCpu)] = cpu; }

  // Installs (or replaces) the kernel of a device type.
  void set(DeviceType type, Fn* fn) { fns_[static_cast<size_t>(type)] = fn; }
  // Whether operator() finds a kernel for the type (an emulated type's CPU kernel counts).
  bool supports(DeviceType type) const {
    return fns_[static_cast<size_t>(type)] != nullptr ||
           (emulated_with_cpu_kernels(type) && fns_[static_cast<size_t>(DeviceType::kCpu)] != nullptr);
  }
  // The kernel for device; Error naming the op and device when no backend provides one.
  Fn* operator()(const Device& device) const {
    Fn* fn = fns_[static_cast<size_t>(device.type)];
    if (!fn && emulated_with_cpu_kernels(device.type) && fns_[static_cast<size_t>(DeviceType::kCpu)] != nullptr) {
      detail::EmulatedThunk<Fn>::target = fns_[static_cast<size_t>(DeviceType::kCpu)];
      return &detail::EmulatedThunk<Fn>::call;
    }
    if (!fn) fail_unsupported(op_, device);
    return fn;
  }
  const char* op() const { return op_; }

 private:
  const char* op_;
  std::array<Fn*, kNumDeviceTypes> fns_{};
};

// The one device all defined inputs live on; Error (naming op and the tensors) when they differ.
Device common_device(const char* op, std::initializer_list<const Tensor*> inputs);

}  // namespace mixtrain::ops
