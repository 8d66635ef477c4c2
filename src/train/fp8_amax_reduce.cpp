#include "fp8_amax_reduce.h"

#include <cmath>

#include "mixtrain/distributed/communicator.h"
#include "mixtrain/nn/layer.h"
#include "mixtrain/precision/fp8_gemm_scales.h"

namespace mixtrain {

namespace {

// Per layer: whether it has cast anything yet on this rank, then the three tensors' amaxes with a NaN as 0, then
// whether each was NaN. MPI's max of a NaN depends on the order it meets it (a > b is false either way), so the
// NaN travels as a flag and comes back on every rank, as one process's history would keep it.
constexpr int kTensors = 3;
constexpr int kSlots = 1 + 2 * kTensors;

// The layers holding delayed histories under their policy, decided from the model alone so that every rank sends
// the same count (a rank whose shard of a small last batch was empty has cast nothing).
std::vector<Layer*> delayed_layers(const std::vector<std::shared_ptr<Layer>>& layers) {
  std::vector<Layer*> out;
  for (const auto& l : layers) {
    const Fp8LayerScales* s = l->fp8_layer_scales();
    if (s && s->recipe() == Fp8Recipe::kDelayed && l->dtype_policy().uses_float8()) out.push_back(l.get());
  }
  return out;
}

// A layer's FP8 scales, to change: Layer offers them read-only (inspect's view); the model owns its layers, none
// of them const.
Fp8LayerScales& scales_of(Layer& layer) { return const_cast<Fp8LayerScales&>(*layer.fp8_layer_scales()); }

}  // namespace

void all_reduce_fp8_amaxes(const std::vector<std::shared_ptr<Layer>>& layers, Communicator& comm) {
  const std::vector<Layer*> delayed = delayed_layers(layers);
  if (delayed.empty()) return;
  std::vector<float> buffer(delayed.size() * kSlots, 0.0f);
  for (size_t i = 0; i < delayed.size(); ++i) {
    Fp8LayerScales& s = scales_of(*delayed[i]);
    if (s.get() == nullptr) continue;  // not cast yet here: zeros, which the max ignores
    float* slot = &buffer[i * kSlots];
    slot[0] = 1.0f;
    const std::vector<DelayedScaling*> d = s.delayed_scalings(delayed[i]->dtype_policy());
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
    const std::vector<DelayedScaling*> d = scales_of(*delayed[i]).delayed_scalings(delayed[i]->dtype_policy());
    for (int k = 0; k < kTensors; ++k) d[k]->record(slot[1 + kTensors + k] > 0.0f ? NAN : slot[1 + k]);
  }
}

}  // namespace mixtrain
