// global_norm and clip_by_global_norm (declared in optimizer.h): the norm is ops::global_norm's, the rule
// ops::clip_factor's, both shared with the fused updates.
#include <cmath>
#include <vector>

#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/fused_update.h"
#include "mixtrain/ops/global_norm.h"
#include "mixtrain/ops/transfer.h"
#include "mixtrain/optim/optimizer.h"

namespace mixtrain {

float global_norm(const std::vector<Tensor>& grads) { return ops::read_scalar(ops::global_norm(grads)); }

void clip_by_global_norm(std::vector<Tensor>& grads, float clip_norm) {
  MIXTRAIN_CHECK(std::isfinite(clip_norm) && clip_norm > 0.0f,
                 "clip_by_global_norm: clip_norm must be finite and > 0, got " << clip_norm);
  float scale = 1.0f;
  if (!ops::clip_factor(global_norm(grads), clip_norm, &scale)) return;
  for (Tensor& g : grads) {
    if (!g.defined()) continue;
    g = ops::scale(g.to(DType::kFloat32), scale);  // a new float32 tensor, each element times scale
  }
}

}  // namespace mixtrain
