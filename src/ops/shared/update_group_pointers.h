// One dtype group of the fused update op (ops/fused_update.h) as the plain pointers and dtype codes the shared
// element function reads (fused_update_element.h): what the CPU reference kernel and the CUDA kernel both hand it.
// Host only.
#pragma once

#include "fused_update_element.h"
#include "mixtrain/ops/fused_update.h"

namespace mixtrain::ops::shared {

inline UpdateGroupPointers update_group_pointers(FusedUpdateGroup& g) {
  UpdateGroupPointers p;
  p.values = g.values.raw();
  p.value_code = float_code(g.values.dtype());
  p.grads = g.grads.raw();
  p.grad_code = float_code(g.grads.dtype());
  for (size_t s = 0; s < g.slots.size() && s < 3; ++s) p.slots[s] = g.slots[s].raw();
  if (!g.slots.empty()) p.slot_code = float_code(g.slots.front().dtype());
  p.copy_count = static_cast<int>(g.copies.size());
  for (int i = 0; i < p.copy_count; ++i) {
    p.copies[i] = g.copies[static_cast<size_t>(i)].raw();
    p.copy_codes[i] = float_code(g.copies[static_cast<size_t>(i)].dtype());
  }
  return p;
}

}  // namespace mixtrain::ops::shared
