#include "fp8_amax_reduce.h"

#include <cmath>

#include "mixtrain/distributed/communicator.h"
#include "mixtrain/nn/layer.h"
#include "mixtrain/precision/fp8_gemm_scales.h"

namespace mixtrain {

namespace {

// Per FP8 GEMM: whether it has cast anything yet on this rank, then its three tensors' amaxes with a NaN as 0, then
// whether each was NaN. MPI's max of a NaN depends on the order it meets it (a > b is false either way), so the
// NaN travels as a flag and comes back on every rank, as one process's history would keep it.
constexpr int kTensors = 3;
constexpr int kSlots = 1 + 2 * kTensors;

// A GEMM's scales, to change, and the policy of the layer holding them.
struct DelayedGemm {
  Fp8LayerScales* scales;
  const DTypePolicy* policy;
};

// The GEMMs holding delayed histories under their layer's policy (every one of a layer's: Dense's and Conv2D's one,
// MultiHeadAttention's two), decided from the model alone so that every rank sends the same count (a rank whose
// shard of a small last batch was empty has cast nothing). Layer offers the scales read-only (inspect's view); the
// model owns its layers, none of them const.
std::vector<DelayedGemm> delayed_gemms(const std::vector<std::shared_ptr<Layer>>& layers) {
  std::vector<DelayedGemm> out;
  for (const auto& l : layers) {
    if (!l->dtype_policy().uses_float8()) continue;
    for (const Fp8Gemm& g : l->fp8_gemms())
      if (g.scales->recipe() == Fp8Recipe::kDelayed)
        out.push_back({const_cast<Fp8LayerScales*>(g.scales), &l->dtype_policy()});
  }
  return out;
}

}  // namespace

void all_reduce_fp8_amaxes(const std::vector<std::shared_ptr<Layer>>& layers, Communicator& comm) {
  const std::vector<DelayedGemm> delayed = delayed_gemms(layers);
  if (delayed.empty()) return;
  std::vector<float> buffer(delayed.size() * kSlots, 0.0f);
  for (size_t i = 0; i < delayed.size(); ++i) {
    if (delayed[i].scales->get() == nullptr) continue;  // not cast yet here: zeros, which the max ignores
    float* slot = &buffer[i * kSlots];
    slot[0] = 1.0f;
    const std::vector<DelayedScaling*> d = delayed[i].scales->delayed_scalings(*delayed[i].policy);
    for (int k = 0; k < kTensors; ++k) {
      const float amax = d[k]->step_amax();
      slot[1 + k] = std::isnan(amax) ? 0.0f : amax;
      slot[1 + kTensors + k] = std::isnan(amax) ? 1.0f : 0.0f;
    }
  }
  comm.all_reduce(buffer.data(), static_cast<int64_t>(buffer.size()), ReduceOp::kMax);
  for (size_t i = 0; i < delayed.size(); ++i) {
    const float* slot = &buffer[i * kSlots];
    if (slot[0] == 0.0f) continue;  // cast on no rank: left without histories, as one process leaves it
    // The ranks' largest is at least this rank's, so recording it makes it the step's amax (a NaN stays NaN).
    const std::vector<DelayedScaling*> d = delayed[i].scales->delayed_scalings(*delayed[i].policy);
    for (int k = 0; k < kTensors; ++k) d[k]->record(slot[1 + kTensors + k] > 0.0f ? NAN : slot[1 + k]);
  }
}

}  // namespace mixtrain
