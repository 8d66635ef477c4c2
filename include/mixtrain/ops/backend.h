// The backend of a device type: one object that owns the device's memory (its allocator), its copies, its
// synchronization and memory figures, and its kernels, one per op of ops/kernel_list.h. Op entries validate on the
// host, then call `kernel_for<Op::softmax>(device)(...)`, which finds the kernel in the backend of the device's type, or
// says which op has none there. The CPU backend loads on first use; a GPU backend is installed by its loader
// (load_cuda_backend). Each kernel file fills its own kernels through a registration function its backend's loader
// calls, so a kernel's signature is written once (the alias in the op's header) and checked by the compiler where
// the kernel is registered; tests/ops/backend_coverage_test.cpp holds every backend to every op or to its list of
// what it does not support.
#pragma once

#include <string>
#include <vector>

#include "mixtrain/core/allocator.h"
#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/dispatch.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

// One value per kernel of the list, named as the Kernels member that holds it (one list makes both).
enum class Op : int {
#define MIXTRAIN_OP_ENUM(member, Fn, name) member,
  MIXTRAIN_KERNEL_LIST(MIXTRAIN_OP_ENUM)
#undef MIXTRAIN_OP_ENUM
};
#define MIXTRAIN_OP_COUNT(member, Fn, name) +1
inline constexpr int kNumOps = 0 MIXTRAIN_KERNEL_LIST(MIXTRAIN_OP_COUNT);
#undef MIXTRAIN_OP_COUNT

// The op's name in errors and status lists ("scaled_dot_product_attention").
const char* op_name(Op op);
// Every op, in list order.
std::vector<Op> all_ops();

// One kernel per op, null where a backend has none.
struct Kernels {
#define MIXTRAIN_KERNEL_MEMBER(member, Fn, name) kernel::Fn* member = nullptr;
  MIXTRAIN_KERNEL_LIST(MIXTRAIN_KERNEL_MEMBER)
#undef MIXTRAIN_KERNEL_MEMBER

  bool has(Op op) const;
};

// The signature and Kernels member of an op, for the typed lookup.
template <Op op>
struct KernelOf;
#define MIXTRAIN_KERNEL_OF(member_name, FnAlias, name)         \
  template <>                                                  \
  struct KernelOf<Op::member_name> {                           \
    using Fn = kernel::FnAlias;                                \
    static constexpr Fn* Kernels::*member = &Kernels::member_name; \
  };
MIXTRAIN_KERNEL_LIST(MIXTRAIN_KERNEL_OF)
#undef MIXTRAIN_KERNEL_OF

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
// Installs a backend for its device type (registering its allocator and strided copy with core), replacing any
// before it; the caller keeps it alive until uninstall_backend. A GPU loader or a test's stand-in device calls it.
void install_backend(Backend* backend);
// Removes the backend of a device type (never the CPU's) and its allocator and copy in core.
void uninstall_backend(DeviceType type);

// Whether kernel<op>(device) finds a kernel for a device of that type (an emulated type's CPU kernel counts).
template <Op op>
bool supports(DeviceType type) {
  constexpr auto member = KernelOf<op>::member;
  if (const Backend* b = find_backend(type); b != nullptr && b->kernels().*member != nullptr) return true;
  return emulated_with_cpu_kernels(type) && cpu_backend().kernels().*member != nullptr;
}

// The kernel of op for device; Error naming the op and the device when its backend has none.
template <Op op>
typename KernelOf<op>::Fn* kernel_for(const Device& device) {
  using Fn = typename KernelOf<op>::Fn;
  constexpr auto member = KernelOf<op>::member;
  const Backend* b = find_backend(device.type);
  Fn* fn = b != nullptr ? b->kernels().*member : nullptr;
  if (fn == nullptr && emulated_with_cpu_kernels(device.type)) {
    if (Fn* cpu = cpu_backend().kernels().*member; cpu != nullptr) {
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
  using Fn = typename KernelOf<op>::Fn;
  KernelOverride(Backend& backend, Fn* fn) : slot_(backend.kernels().*KernelOf<op>::member), saved_(slot_) {
    slot_ = fn;
  }
  ~KernelOverride() { slot_ = saved_; }
  KernelOverride(const KernelOverride&) = delete;
  KernelOverride& operator=(const KernelOverride&) = delete;
  // The kernel it replaced.
  Fn* original() const { return saved_; }

 private:
  Fn*& slot_;
  Fn* saved_;
};

}  // namespace mixtrain::ops
