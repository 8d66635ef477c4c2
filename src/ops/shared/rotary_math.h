// The element arithmetic of the rotary embedding (ops/rotary_embedding.h), float32, written once for the CPU kernel
// (cpu/rotary_embedding.cpp) and the GPU kernel (cuda/rotary_embedding.cu) so both give the same bits: two
// products and one sum or difference, each rounded on its own (no fused multiply-add).
#pragma once

#include <cstdint>

#include "host_device.h"

namespace mixtrain::ops::shared {

// Output element j of one head (j < head_dim), from the head's own element `own` = x[j] and its partner = x[j + h]
// when j < h, x[j - h] otherwise (h = head_dim / 2), with c and s the cosine and sine of pair j mod h.
//   first half:  own c - partner s        second half:  own c + partner s
// inverse turns by -angle (the gradient): the signs of the sine swap.
MIXTRAIN_HOST_DEVICE inline float rotary_value(float own, float partner, float c, float s, bool first_half,
                                               bool inverse) {
  const float turned = mul_rn(own, c), cross = mul_rn(partner, s);
  return first_half != inverse ? sub_rn(turned, cross) : add_rn(turned, cross);
}

// Where x's element (column col of a row) finds its partner and its pair: column offsets within a head.
struct RotaryPlace {
  int64_t partner_col;  // the partner's column
  int64_t pair;         // the pair index, 0 .. head_dim / 2 - 1: the table column
  bool first_half;
};

MIXTRAIN_HOST_DEVICE inline RotaryPlace rotary_place(int64_t col, int64_t head_dim) {
  const int64_t half = head_dim / 2, j = col % head_dim;
  if (j < half) return {col + half, j, true};
  return {col - half, j - half, false};
}

}  // namespace mixtrain::ops::shared
