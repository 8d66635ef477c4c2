// The one check, message and hint for operands whose dtypes must agree (matmul, linear, conv2d, attention).
// The usual cause is a float32 variable meeting a 16-bit activation under a mixed policy, so the hint says how
// to cast and how a layer reads its variables in its compute dtype, wherever the mismatch is found.
#pragma once

#include <string_view>

#include "mixtrain/core/tensor.h"

namespace mixtrain::ops {

// Throws Error (kInvalidInput) "<op>: <a_name> <a> and <b_name> <b> differ in dtype (float16 and float32)" with
// the hint of dtype_mismatch_hint() when a and b have different dtypes; returns otherwise.
void check_same_dtype(std::string_view op, std::string_view a_name, const Tensor& a, std::string_view b_name,
                      const Tensor& b);

// "cast one operand ... or, inside a layer's call(), read the layer's variables with autocast(variable) ..."
const char* dtype_mismatch_hint();

}  // namespace mixtrain::ops
