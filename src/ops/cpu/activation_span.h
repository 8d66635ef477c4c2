// An activation over one contiguous span of elements: what the CPU activation kernel runs on each block of a
// tensor, and what linear_activation's GEMM post-op runs on each row of a finished block of the product, so the
// fused activation is the same code as the separate pass and gives its bits.
#pragma once

#include <cstdint>

#include "mixtrain/core/dtype.h"
#include "mixtrain/ops/elementwise.h"

namespace mixtrain::ops::cpu {

// y[i] = f(x[i]) for i in [0, n): x and y hold n elements of dtype (float32, float16 or bfloat16), read as
// float32 and rounded once into dtype. x may be y (in place). Runs on the calling thread; never throws for a
// floating dtype, so it may run inside an OpenMP region.
void activation_span(const void* x, void* y, DType dtype, int64_t n, Activation a);

}  // namespace mixtrain::ops::cpu
