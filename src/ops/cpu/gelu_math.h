// GELU for the CPU kernels: the shared host-and-device form (ops/shared/gelu_math.h, where the method and its
// accuracy are described), so the GPU kernel computes the same bits as the CPU's.
#pragma once

#include "../shared/gelu_math.h"

namespace mixtrain::ops::cpu::gelu_math {

using shared::gelu_math::gelu;
using shared::gelu_math::gelu_derivative;

}  // namespace mixtrain::ops::cpu::gelu_math
