// Moving tensors between devices: the one op that reads one device and writes another.
#pragma once

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

// x on `device`, as a contiguous tensor of the same shape and dtype (x itself when it is already there).
// A strided view is made contiguous where it lives first, which a device backend does only for views it
// supports; pass contiguous tensors to be safe.
Tensor to_device(const Tensor& x, const Device& device);

// The value of a one-element tensor on any device, as float: on a device it is copied back first, which waits for
// the work queued there.
float read_scalar(const Tensor& x);

// Waits until everything queued on `device` has finished: a GPU runs kernels asynchronously, so a host clock
// read around them needs this on both sides. Nothing to wait for on the CPU. Errors a kernel raised since the
// last check surface here, as an Error naming the device.
void synchronize(const Device& device);

// Makes `device` the current device of this thread for libraries that work on the current device (NCCL creates a
// communicator on it). Nothing to do on the CPU.
void make_current(const Device& device);

// A device's memory as its system reports it: on a GPU the driver's free and total bytes (other processes' use
// included), on the CPU MemAvailable and MemTotal (0 and 0 where /proc/meminfo cannot be read).
DeviceMemory device_memory(const Device& device);

// x converted to dtype on its own device, rounding as core's conversions do (x itself when it has that dtype;
// a strided view is made contiguous first). The ops' backward passes convert an incoming gradient of another
// dtype with it, so that a float32 gradient reaches a 16-bit op on a GPU too (Tensor::to reads host memory only).
Tensor cast(const Tensor& x, DType dtype);

// dst = src, the same dtype and element count, on any two devices (dst contiguous; a strided src is made contiguous
// where it lives first): host to host a plain copy, otherwise the copy of the device that is not the CPU. What
// code above ops calls to fill a buffer it keeps (a parameter arena's, an optimizer's flat slots).
void copy_into(const Tensor& src, Tensor& dst);

// dst = src converted to dst's dtype, rounding as core's conversions do: both contiguous with the same element count
// on one device. On the CPU in blocks across threads (a parameter arena's buffers reach hundreds of MB); on a device
// by its backend's cast kernel, with nothing read back.
void cast_into(const Tensor& src, Tensor& dst);

namespace kernel {
// dst = src converted to dst's dtype: both contiguous, same element count, same device.
using CastFn = void(const Tensor& src, Tensor& dst);
}  // namespace kernel
MIXTRAIN_KERNEL_SIGNATURE(cast, CastFn)

}  // namespace mixtrain::ops
