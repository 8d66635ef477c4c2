// Which dtype attention's (B, H, T, S) score tensor has on the GPU (cuda/attention.cu). Plain C++, no CUDA type:
// the choice and the arithmetic it relies on are checked on every machine (tests/ops/cuda_attention_test.cpp,
// CudaAttentionScores.*).
#pragma once

#include "mixtrain/core/dtype.h"

namespace mixtrain::ops::cuda {

// The CPU rounds each logit fl32(fl32(q k^T) * scale) once into the compute dtype before the softmax
// (cpu/attention.cpp). The GPU's score product is scaled_bmm with alpha = scale: the float32 sum times the scale,
// one float32 rounding, then one rounding into the score tensor's dtype, the same two steps on the same float32
// sum. So the scores are written in the compute dtype itself (half the bytes of float32 under a 16-bit policy, and
// the row kernel reads them as they are); only the float32 logits, when asked for (inspection), need float32 scores.
inline DType attention_score_dtype(DType compute, bool float32_logits) {
  return float32_logits ? DType::kFloat32 : compute;
}

}  // namespace mixtrain::ops::cuda
