// CUDA kernel of the fused update op (ops/fused_update.h): one launch per dtype group over its runs, then one thread
// that advances the iteration counter. Each element goes through ops/shared/fused_update_element.h, the CPU
// optimizer's operations in its order with every product, sum, quotient and square root rounded once (no fused multiply-add),
// so the GPU gives the CPU's bits. The skip flag and the counter are read on the device: nothing comes back to
// the host.
#include <cuda_runtime.h>

#include "../shared/clip_factor.h"
#include "../shared/update_group_pointers.h"
#include "backend.h"
#include "device_util.cuh"
#include "mixtrain/ops/fused_update.h"

namespace mixtrain::ops::cuda {

namespace {

// runs: (run_count, 3) int64 rows of begin, count, class. Every run is spread over the whole grid in turn: a
// model's runs are few (one per dtype for Adam, about two per layer for AdamW with exclusions).
__global__ void fused_update_kernel(shared::UpdateGroupPointers p, const int64_t* runs, int64_t run_count,
                                    FusedUpdateStep step, const float* found_inf, const int64_t* iterations,
                                    const float* global_norm) {
  if (found_inf != nullptr && *found_inf != 0.0f) return;
  const int64_t k = *iterations - step.first_iterations;
  // The host's window always covers the counter. Should it not, nothing is updated: advance_iterations_kernel keeps
  // the finding for the host's next read (a trap here would end the CUDA context, every later call failing
  // without saying why).
  if (k < 0 || k >= step.window) return;
  const UpdateRates rates = step.rates[k];
  const shared::AdamCoefficients c{rates.alpha, step.rule.one_minus_beta1, step.rule.one_minus_beta2,
                                   step.rule.epsilon};
  float factor = 1.0f;
  const bool scaled = global_norm != nullptr && shared::clip_factor(*global_norm, step.clip_norm, &factor);
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = 0; r < run_count; ++r) {
    const int64_t begin = runs[3 * r], end = begin + runs[3 * r + 1];
    const bool decay = runs[3 * r + 2] == 1;
    for (int64_t i = begin + first; i < end; i += stride)
      shared::fused_update_element(p, i, step.rule, c, rates.learning_rate, scaled, factor, decay, *iterations);
  }
}

// After every group has read the counter: one more completed update, unless the step was skipped (then only when
// skipped steps count). A counter outside the window (no group updated) stays as it was and the finding goes into
// the device's record, which the host's next read raises as the CPU's check does. One thread: no race.
__global__ void advance_iterations_kernel(const float* found_inf, int64_t* iterations, int64_t first_iterations,
                                          int window, bool skipped_steps_advance, LabelError* record) {
  const bool skipped = found_inf != nullptr && *found_inf != 0.0f;
  if (skipped) {
    if (skipped_steps_advance) ++*iterations;
    return;
  }
  const int64_t k = *iterations - first_iterations;
  if (k >= 0 && k < window) {
    ++*iterations;
    return;
  }
  if (record->row == kNoFinding)
    *record = LabelError{static_cast<unsigned long long>(first_iterations), static_cast<long long>(*iterations),
                         static_cast<long long>(window), static_cast<int>(LabelOp::kFusedUpdateCounter)};
}

}  // namespace

void fused_update(std::vector<FusedUpdateGroup>& groups, const FusedUpdateStep& step, const Tensor* found_inf,
                  Tensor& iterations, const Tensor* global_norm) {
  check_cuda(cudaSetDevice(iterations.device().index), "cudaSetDevice");
  const float* flag = found_inf != nullptr ? found_inf->data<float>() : nullptr;
  const float* norm = global_norm != nullptr ? global_norm->data<float>() : nullptr;
  LabelError* record = label_error_record(iterations.device().index);
  for (FusedUpdateGroup& g : groups) {
    if (g.run_count == 0) continue;
    const shared::UpdateGroupPointers p = shared::update_group_pointers(g);
    // Sized by the whole buffer (the runs' lengths are on the device); the grid-stride loop covers the rest.
    fused_update_kernel<<<device::blocks_for(g.values.numel()), device::kThreads>>>(
        p, g.runs.data<int64_t>(), g.run_count, step, flag, iterations.data<int64_t>(), norm);
    device::launched("fused_update");
  }
  advance_iterations_kernel<<<1, 1>>>(flag, iterations.data<int64_t>(), step.first_iterations, step.window,
                                      step.skipped_steps_advance_iterations, record);
  device::launched("fused_update (iteration counter)");
}

void register_fused_update_kernels(Kernels& k) {
  k.set<Op::fused_update>(&fused_update);
}

}  // namespace mixtrain::ops::cuda
