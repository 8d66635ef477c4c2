// One dtype group of the fused Adam op (ops/fused_adam.h) as the plain pointers and dtype codes the shared
// element function reads (adam_update.h): what the CPU reference kernel and the CUDA kernel both hand it. Host only.
#pragma once

#include "adam_update.h"
#include "mixtrain/ops/fused_adam.h"

namespace mixtrain::ops::shared {

inline AdamGroupPointers adam_group_pointers(FusedAdamGroup& g) {
  AdamGroupPointers p;
  p.values = g.values.raw();
  p.value_code = float_code(g.values.dtype());
  p.grads = g.grads.raw();
  p.grad_code = float_code(g.grads.dtype());
  p.m = g.m.data<float>();
  p.v = g.v.data<float>();
  p.copy_count = static_cast<int>(g.copies.size());
  for (int i = 0; i < p.copy_count; ++i) {
    p.copies[i] = g.copies[static_cast<size_t>(i)].raw();
    p.copy_codes[i] = float_code(g.copies[static_cast<size_t>(i)].dtype());
  }
  return p;
}

}  // namespace mixtrain::ops::shared
