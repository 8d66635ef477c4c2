// Moving tensors between devices: the one op that reads one device and writes another.
#pragma once

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/dispatch.h"

namespace mixtrain::ops {

// x on `device`, as a contiguous tensor of the same shape and dtype (x itself when it is already there).
// A strided view is made contiguous where it lives first, which a device backend does only for views it
// supports; pass contiguous tensors to be safe.
Tensor to_device(const Tensor& x, const Device& device);

namespace kernel {
// dst = src, both contiguous with the same dtype and element count, one of them on the table's device (the
// other in host memory or on another device of the same type). Keyed by the device that is not the CPU.
using DeviceCopyFn = void(const Tensor& src, Tensor& dst);
KernelTable<DeviceCopyFn>& device_copy_table();
}  // namespace kernel

}  // namespace mixtrain::ops
