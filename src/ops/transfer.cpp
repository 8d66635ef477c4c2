#include "mixtrain/ops/transfer.h"

#include <string>

#include "mixtrain/ops/backend.h"

namespace mixtrain::ops {

float read_scalar(const Tensor& x) {
  MIXTRAIN_CHECK(x.defined() && x.numel() == 1, "read_scalar: needs a one-element tensor, got " << x.describe());
  return x.device().is_cpu() ? x.item() : to_device(x, Device::cpu()).item();
}

void synchronize(const Device& device) { backend_for("synchronize", device).synchronize(device.index); }

void make_current(const Device& device) { backend_for("make_current", device).make_current(device.index); }

DeviceMemory device_memory(const Device& device) { return backend_for("device_memory", device).memory(device.index); }

Tensor cast(const Tensor& x, DType dtype) {
  MIXTRAIN_CHECK(x.defined(), "cast: the tensor is undefined");
  if (x.dtype() == dtype) return x;
  const Tensor src = x.contiguous();
  Tensor dst = Tensor::empty(src.shape(), dtype, src.device());
  if (src.numel() == 0) return dst;
  kernel_for<Op::cast>(src.device())(src, dst);
  return dst;
}

Tensor to_device(const Tensor& x, const Device& device) {
  MIXTRAIN_CHECK(x.defined(), "to_device: the tensor is undefined");
  if (x.device() == device && x.is_contiguous()) return x;
  const Tensor src = x.contiguous();
  Tensor dst = Tensor::empty(src.shape(), src.dtype(), device);
  if (src.numel() == 0) return dst;
  // The backend that owns the non-host side does the copy (the CPU's when both are in host memory).
  const Device owner = src.device().is_cpu() ? device : src.device();
  backend_for("to_device", owner).copy(src, dst);
  return dst;
}

void copy_into(const Tensor& src, Tensor& dst) {
  MIXTRAIN_CHECK(src.defined() && dst.defined() && src.dtype() == dst.dtype() && src.numel() == dst.numel() &&
                     dst.is_contiguous(),
                 "copy_into: " << (src.defined() ? src.describe() : std::string("an undefined tensor")) << " into "
                               << (dst.defined() ? dst.describe() : std::string("an undefined tensor"))
                               << " (the same dtype and element count, the destination contiguous)");
  if (src.device().is_cpu() && dst.device().is_cpu()) {
    dst.copy_from(src);
    return;
  }
  backend_for("to_device", dst.device().is_cpu() ? src.device() : dst.device()).copy(src.contiguous(), dst);
}

void cast_into(const Tensor& src, Tensor& dst) {
  MIXTRAIN_CHECK(src.defined() && dst.defined() && src.numel() == dst.numel() && src.is_contiguous() &&
                     dst.is_contiguous() && src.device() == dst.device(),
                 "cast_into: " << (src.defined() ? src.describe() : std::string("an undefined tensor")) << " into "
                               << (dst.defined() ? dst.describe() : std::string("an undefined tensor"))
                               << " (contiguous, the same element count, one device)");
  if (src.numel() == 0) return;
  kernel_for<Op::cast>(src.device())(src, dst);
}

}  // namespace mixtrain::ops
