// CPU kernels of loss scaling: the fused unscale and finite check (blocks widened to float32 with the vectorised
// conversion, multiplied, stored, tested with the exponent-bits test of count_nonfinite) and the scale rule.
#include <algorithm>

#include "../shared/loss_scale_rule.h"
#include "float_lanes.h"
#include "mixtrain/core/half.h"
#include "mixtrain/ops/loss_scale.h"
#include "cpu_backend.h"

namespace mixtrain::ops::cpu {

namespace {
constexpr int64_t kBlock = 2048;
constexpr int64_t kParallelMin = int64_t{1} << 16;  // below this a thread team costs more than it saves

// o[i] *= inv_scale for a block, adding to *bad how many results are not finite. A product rounds the same at
// every vector width, so the AVX2 variant gives the baseline's bits at twice its lanes: the pass runs over
// every gradient of a float16 step.
MIXTRAIN_CPU_BODY void unscale_block_body(float* o, int64_t m, float inv_scale, int64_t* bad) {
  int64_t count = 0;
  for (int64_t i = 0; i < m; ++i) {
    const float v = o[i] * inv_scale;
    o[i] = v;
    count += (float_bits(v) & 0x7F800000u) == 0x7F800000u;
  }
  *bad += count;
}
MIXTRAIN_CPU_VARIANTS(unscale_block)
}  // namespace

int64_t unscale_and_count_nonfinite(const Tensor& scaled, float inv_scale, Tensor& out) {
  const int64_t n = scaled.numel();
  const DType dt = scaled.dtype();
  const size_t es = dtype_size(dt);
  const char* sp = static_cast<const char*>(scaled.raw());
  float* op = static_cast<float*>(out.raw());
  int64_t bad = 0;
#pragma omp parallel for if (n > kParallelMin) schedule(static) reduction(+ : bad)
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    float* o = op + b;
    // float32 input is read in place (out may alias it); 16-bit input is widened into out first.
    if (dt != DType::kFloat32 || static_cast<const void*>(sp + b * es) != static_cast<const void*>(o))
      convert_elements(sp + b * es, dt, o, DType::kFloat32, m);
    int64_t local = 0;
    unscale_block(o, m, inv_scale, &local);
    bad += local;
  }
  return bad;
}

void unscale_and_check(const Tensor& scaled, const Tensor& scale_state, Tensor& found_inf, Tensor& out) {
  const float inv = shared::inverse_scale(scale_state.data<float>()[0]);
  if (unscale_and_count_nonfinite(scaled, inv, out) != 0) found_inf.data<float>()[0] = 1.0f;
}

void apply_loss_scale(const Tensor& loss, const Tensor& scale_state, Tensor& out) {
  const float scale = scale_state.data<float>()[0];
  const float* s = loss.data<float>();
  float* d = out.data<float>();
  for (int64_t i = 0; i < loss.numel(); ++i) d[i] = s[i] * scale;
}

void update_loss_scale(Tensor& scale_state, Tensor& counters, const Tensor& found_inf, const LossScaleRule& rule) {
  shared::loss_scale_rule_step(scale_state.data<float>(), counters.data<int32_t>(),
                               found_inf.data<float>()[0] != 0.0f, rule);
}

void register_loss_scale_kernels(Kernels& k) {
  k.set<Op::unscale_and_count_nonfinite>(&unscale_and_count_nonfinite);
  k.set<Op::unscale_and_check>(&unscale_and_check);
  k.set<Op::update_loss_scale>(&update_loss_scale);
  k.set<Op::apply_loss_scale>(&apply_loss_scale);
}

}  // namespace mixtrain::ops::cpu
