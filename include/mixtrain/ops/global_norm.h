// The global L2 norm of a list of tensors, what Keras' global_clipnorm clips by: every element widened to float32,
// squared and summed in double, the square root rounded once into float32. The result is a float32 (1,) tensor on
// the tensors' device, so an update that clips on a GPU reads it there (ops/fused_update.h) and the host never waits.
//
// clip_factor is the clipping rule on that norm, one function for the CPU optimizer and every device kernel
// (ops/shared/clip_factor.h): no scaling when the norm is finite and at most clip_norm, clip_norm / norm above it,
// NaN when the norm is not finite (so the update writes NaN, as Keras' clipping of a non-finite gradient does).
#pragma once

#include <vector>

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/kernel_list.h"

namespace mixtrain::ops {

// Undefined tensors are skipped; every other one must be floating and on one device (an empty list: the CPU's 0).
Tensor global_norm(const std::vector<Tensor>& xs);

namespace kernel {
// out: float32 (1,). The CPU kernel sums each tensor in fixed chunks, in order, so its bits never depend on the
// thread count; a GPU adds the same double terms in its own fixed order (one float32 unit at most apart).
using GlobalNormFn = void(const std::vector<Tensor>& xs, Tensor& out);
}  // namespace kernel
MIXTRAIN_KERNEL_SIGNATURE(global_norm, GlobalNormFn)

}  // namespace mixtrain::ops
