// Loss-scaling ops: the fused unscale-and-check a LossScaleOptimizer runs over scaled gradients. The finite
// test is the one of count_nonfinite (elementwise.h): an element is non-finite when every exponent bit of its
// float32 value is set.
#pragma once

#include <cstdint>

#include "mixtrain/core/tensor.h"
#include "mixtrain/ops/dispatch.h"

namespace mixtrain::ops {

// out = scaled * inv_scale in float32 (each element widened to float32, multiplied once, not rounded again),
// and the number of inf or NaN elements of out. Testing the unscaled value also catches a finite scaled
// gradient that overflows when the scale is below 1. scaled: any floating dtype and shape; out: a contiguous
// float32 tensor with scaled's element count on scaled's device, which may be scaled itself (float32).
int64_t unscale_and_count_nonfinite(const Tensor& scaled, float inv_scale, Tensor& out);
// In place on a contiguous float32 tensor (an arena's flat gradient buffer): grads *= inv_scale.
int64_t unscale_and_count_nonfinite(Tensor& grads, float inv_scale);

namespace kernel {
// out (float32, n) = scaled (n) * inv_scale; returns the non-finite count of out. out may alias scaled.
using UnscaleFn = int64_t(const Tensor& scaled, float inv_scale, Tensor& out);
KernelTable<UnscaleFn>& unscale_table();
}  // namespace kernel

}  // namespace mixtrain::ops
