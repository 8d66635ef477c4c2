// global_norm and clip_by_global_norm (declared in optimizer.h): the norm is ops::global_norm's, the rule
// ops/shared/clip_factor.h's, both shared with the fused device updates.
#include <cmath>
#include <vector>

#include "mixtrain/ops/global_norm.h"
#include "mixtrain/ops/transfer.h"
#include "mixtrain/optim/optimizer.h"
#include "ops/shared/clip_factor.h"

namespace mixtrain {

float global_norm(const std::vector<Tensor>& grads) { return ops::read_scalar(ops::global_norm(grads)); }

void clip_by_global_norm(std::vector<Tensor>& grads, float clip_norm) {
  MIXTRAIN_CHECK(std::isfinite(clip_norm) && clip_norm > 0.0f,
                 "clip_by_global_norm: clip_norm must be finite and > 0, got " << clip_norm);
  float scale = 1.0f;
  if (!ops::shared::clip_factor(global_norm(grads), clip_norm, &scale)) return;
  for (Tensor& g : grads) {
    if (!g.defined()) continue;
    Tensor src = g.to(DType::kFloat32);
    Tensor out = Tensor::empty(g.shape(), DType::kFloat32);
    const float* s = src.data<float>();
    float* d = out.data<float>();
    const int64_t n = g.numel();
    for (int64_t i = 0; i < n; ++i) d[i] = s[i] * scale;
    g = out;
  }
}

}  // namespace mixtrain
