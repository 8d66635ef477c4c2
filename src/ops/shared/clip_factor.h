// Global-norm clipping's factor from the norm (ops/global_norm.h), for the host and the device: the CPU optimizer,
// clip_by_global_norm and the fused device updates all decide with this one function.
#pragma once

#include "host_device.h"

namespace mixtrain::ops::shared {

// False when norm is finite and <= clip_norm (the gradients stay as they are); otherwise true, with *factor the
// float32 rounding of clip_norm / norm in double, or NaN for a norm that is not finite.
MIXTRAIN_HOST_DEVICE inline bool clip_factor(float norm, float clip_norm, float* factor) {
  const bool finite = float_is_finite(norm);
  if (finite && norm <= clip_norm) return false;
  *factor = finite ? static_cast<float>(ddiv_rn(static_cast<double>(clip_norm), static_cast<double>(norm)))
                   : float_of(0x7FC00000u);  // the quiet NaN
  return true;
}

}  // namespace mixtrain::ops::shared
