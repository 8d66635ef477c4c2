// inspect's FP8 rows (train/inspect.h): how each quantized operand of an FP8 layer fares when cast with the scale the
// layer would use, from the float32 values the shadow run sees.
#pragma once

#include <vector>

#include "mixtrain/nn/layer.h"
#include "mixtrain/train/inspect.h"

namespace mixtrain::detail {

// Whether `layer` quantizes GEMM operands under `policy` (its real one, before the shadow switched it).
bool inspects_fp8(const Layer& layer, const DTypePolicy& policy);

// Merges into out (made on first use: input, weight, grad) the statistics of `values` cast as `tensor` ("input",
// "weight" or "grad") of `layer` under `policy`.
void add_fp8_inspection(const Layer& layer, const DTypePolicy& policy, const char* tensor, const Tensor& values,
                        std::vector<Fp8TensorInspection>& out);

}  // namespace mixtrain::detail
