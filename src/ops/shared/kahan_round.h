// Kahan compensation of bfloat16 master weights (AdamOptions::kahan_summation, the third Adam slot): next to each
// bfloat16 weight w a bfloat16 c holds what rounding w lost, so w + c carries about 16 bits of mantissa. The update
// runs on w + c in float32 and splits its result back: w its nearest bfloat16, c the nearest bfloat16 to the rest.
// An update far below half an ulp of w accumulates in c until it moves w, exactly rather than on average (compare
// stochastic_round.h). The compensation is the one optimi's and AnyPrecisionAdamW's Kahan summation keep (a
// bfloat16 buffer beside the bfloat16 weight); here the float32 rule reads w + c and the result is rounded once.
#pragma once

#include <cstdint>

#include "float16_convert.h"
#include "host_device.h"

namespace mixtrain::ops::shared {

// The compensated weight: w + c in float32.
MIXTRAIN_HOST_DEVICE inline float kahan_widen(uint16_t w, uint16_t c) {
  return add_rn(bfloat16_to_float(w), bfloat16_to_float(c));
}

// x split into *w, its nearest bfloat16, and *c, the nearest bfloat16 to x - w (exact in float32: w is within a
// factor of two of x). Where x - w is not finite (x infinite or NaN, or rounding past the largest bfloat16) *c is
// 0: nothing is left to carry, and a NaN would otherwise poison the next update of a weight that recovered.
MIXTRAIN_HOST_DEVICE inline void kahan_split(float x, uint16_t* w, uint16_t* c) {
  *w = float_to_bfloat16(x);
  const float rest = sub_rn(x, bfloat16_to_float(*w));
  *c = (float_bits(rest) & 0x7F800000u) == 0x7F800000u ? uint16_t{0} : float_to_bfloat16(rest);
}

}  // namespace mixtrain::ops::shared
