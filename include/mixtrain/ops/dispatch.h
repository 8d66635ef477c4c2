// What the dispatch seam (ops/backend.h) shares with tests: the error for a device without a kernel, the emulated
// device (a host-backed stand-in for a GPU whose ops run the CPU's kernels) and the check that an op's inputs share
// one device. Kernels receive validated, contiguous tensors and preallocated outputs on their device.
#pragma once

#include <utility>
#include <initializer_list>

#include "mixtrain/core/tensor.h"

namespace mixtrain::ops {

[[noreturn]] void fail_unsupported(const char* op, const Device& device);

// An emulated device: a device type whose memory the host addresses, standing in for a GPU in tests, so that the
// code above ops runs device tensors end to end on any machine (the test installs the type's allocator and
// copies). While on, kernel_for hands out the CPU kernel where the type's backend has none; a real backend's kernels
// always take precedence. Off by default.
void emulate_with_cpu_kernels(DeviceType type, bool on);
bool emulated_with_cpu_kernels(DeviceType type);

// Whether an emulated device's kernel is running (the CPU kernel kernel_for handed out for it, with the OpenMP threads
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
// kernel_for just before the caller calls the thunk (kernel_for<op>(device)(args...)).
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

// The one device all defined inputs live on; Error (naming op and the tensors) when they differ.
Device common_device(const char* op, std::initializer_list<const Tensor*> inputs);

}  // namespace mixtrain::ops
