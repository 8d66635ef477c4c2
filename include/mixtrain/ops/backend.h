// The backend of a device type: one object that owns the device's memory (its allocator), its copies, its
// synchronization and memory figures, and its kernels, one per op of ops/kernel_list.h. Op entries validate on the
// host, then call `kernel_for<Op::softmax>(device)(...)`, which finds the kernel in the backend of the device's type, or
// says which op has none there. The CPU backend loads on first use; a GPU backend is installed by its loader
// (load_cuda_backend). Each kernel file fills its own kernels through a registration function its backend's loader
// calls, so a kernel's signature is written once (the alias in the op's header) and checked by the compiler where
// the kernel is registered; tests/ops/backend_coverage_test.cpp holds every backend to every op or to its list of
// what it does not support.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "mixtrain/core/allocator.h"
#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/dispatch.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

// The op's name in errors and status lists ("scaled_dot_product_attention").
const char* op_name(Op op);
// Every op, in list order.
std::vector<Op> all_ops();

// The kernel type of an op (the signature its header declares).
template <Op op>
using KernelFn = typename KernelOf<op>::Fn;

// One kernel per op, null where a backend has none. Stored untyped, one slot per Op; set and get are typed by the
// op's signature, so a kernel registered with other arguments does not compile.
class Kernels {
 public:
  template <Op op>
  void set(KernelFn<op>* fn) {
    slots_[static_cast<size_t>(op)] = reinterpret_cast<Untyped>(fn);
  }
  template <Op op>
  KernelFn<op>* get() const {
    return reinterpret_cast<KernelFn<op>*>(slots_[static_cast<size_t>(op)]);
  }
  bool has(Op op) const { return slots_[static_cast<size_t>(op)] != nullptr; }

 private:
  using Untyped = void (*)();
  std::array<Untyped, kNumOps> slots_{};
};

// A device's memory as its system reports it (ops::device_memory): on a GPU the driver's free and total bytes (other
// processes' use included), on the CPU MemAvailable and MemTotal.
struct DeviceMemory {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};

class Backend {
 public:
  explicit Backend(DeviceType type) : type_(type) {}
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  DeviceType type() const { return type_; }
  Kernels& kernels() { return kernels_; }
  const Kernels& kernels() const { return kernels_; }
  // The ops with a kernel here, by name, in list order.
  std::vector<std::string> op_names() const;

  // Device services. The defaults say the device cannot do it ("synchronize: no kernel for device cuda:0"), as a
  // missing kernel does.
  // The allocator core's Tensor::empty uses for this device type (registered when the backend is installed).
  virtual DeviceAllocator* allocator() { return nullptr; }
  // Tensor::copy_from between two tensors on one device of this type (any strides, a dtype conversion), registered
  // with core when the backend is installed; null where core's host copy serves.
  virtual ::mixtrain::DeviceCopyFn strided_copy() { return nullptr; }
  // dst = src, both contiguous with the same dtype and element count, one of them on this backend's device type and
  // the other in host memory or on another device of the type (ops::to_device).
  virtual void copy(const Tensor& src, Tensor& dst);
  // Blocks until the device of this type and index is idle.
  virtual void synchronize(int device_index);
  // Makes the device of this type and index current on this thread.
  virtual void make_current(int device_index);
  // The memory of the device of this type and index, as its system reports it.
  virtual DeviceMemory memory(int device_index);

 private:
  DeviceType type_;
  Kernels kernels_;
};

// The backend installed for a device type (the CPU's loads on first call), or null.
Backend* find_backend(DeviceType type);
// The backend of device's type; Error naming op and the device when there is none.
Backend& backend_for(const char* op, const Device& device);
// The CPU backend, loaded on first call.
Backend& cpu_backend();
namespace cpu {
// The CPU backend with every CPU kernel registered (src/ops/cpu/backend.cpp; cpu_backend() calls it once).
Backend* make_cpu_backend();
}  // namespace cpu

// Installs a backend for its device type (registering its allocator and strided copy with core), replacing any
// before it; the caller keeps it alive until uninstall_backend. A GPU loader or a test's stand-in device calls it.
void install_backend(Backend* backend);
// Removes the backend of a device type (never the CPU's) and its allocator and copy in core.
void uninstall_backend(DeviceType type);

// Whether kernel<op>(device) finds a kernel for a device of that type (an emulated type's CPU kernel counts).
template <Op op>
bool supports(DeviceType type) {
  if (const Backend* b = find_backend(type); b != nullptr && b->kernels().has(op)) return true;
  return emulated_with_cpu_kernels(type) && cpu_backend().kernels().has(op);
}

// The kernel of op for device; Error naming the op and the device when its backend has none.
template <Op op>
KernelFn<op>* kernel_for(const Device& device) {
  using Fn = KernelFn<op>;
  const Backend* b = find_backend(device.type);
  Fn* fn = b != nullptr ? b->kernels().template get<op>() : nullptr;
  if (fn == nullptr && emulated_with_cpu_kernels(device.type)) {
    if (Fn* cpu = cpu_backend().kernels().template get<op>(); cpu != nullptr) {
      detail::EmulatedThunk<Fn>::target = cpu;
      return &detail::EmulatedThunk<Fn>::call;
    }
  }
  if (fn == nullptr) fail_unsupported(op_name(op), device);
  return fn;
}

// Replaces one kernel of an installed backend for a scope, then restores it: how a test counts or stands in for
// the calls an op makes.
template <Op op>
class KernelOverride {
 public:
  using Fn = KernelFn<op>;
  KernelOverride(Backend& backend, Fn* fn) : kernels_(backend.kernels()), saved_(kernels_.get<op>()) {
    kernels_.set<op>(fn);
  }
  ~KernelOverride() { kernels_.set<op>(saved_); }
  KernelOverride(const KernelOverride&) = delete;
  KernelOverride& operator=(const KernelOverride&) = delete;
  // The kernel it replaced.
  Fn* original() const { return saved_; }

 private:
  Kernels& kernels_;
  Fn* saved_;
};

}  // namespace mixtrain::ops
