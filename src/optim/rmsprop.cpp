#include "mixtrain/optim/rmsprop.h"

#include <cmath>

#include "optim/isa_variants.h"

namespace mixtrain {

namespace {
// Below this many elements a thread team costs more than it saves.
constexpr int64_t kParallelMin = int64_t{1} << 16;

// A square root and a division per element, like Adam: compute-bound at the baseline's 4-wide SSE, so it runs in
// the widest variant the instruction-set level allows (optim/isa_variants.h). m is null without momentum, a is
// null unless centered; each case is its own loop so each vectorises.
[[gnu::always_inline]] inline void rmsprop_span(float* w, const float* g, float* v, float* m, float* a, int64_t n,
                                                float lr, float rho, float one_minus_rho, float mu, float eps) {
  if (a == nullptr && m == nullptr) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      v[i] = rho * v[i] + one_minus_rho * (g[i] * g[i]);
      w[i] -= (lr * g[i]) / std::sqrt(v[i] + eps);
    }
  } else if (a == nullptr) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      v[i] = rho * v[i] + one_minus_rho * (g[i] * g[i]);
      m[i] = mu * m[i] + (lr * g[i]) / std::sqrt(v[i] + eps);
      w[i] -= m[i];
    }
  } else if (m == nullptr) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      v[i] = rho * v[i] + one_minus_rho * (g[i] * g[i]);
      a[i] = rho * a[i] + one_minus_rho * g[i];
      w[i] -= (lr * g[i]) / std::sqrt((v[i] - a[i] * a[i]) + eps);
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      v[i] = rho * v[i] + one_minus_rho * (g[i] * g[i]);
      a[i] = rho * a[i] + one_minus_rho * g[i];
      m[i] = mu * m[i] + (lr * g[i]) / std::sqrt((v[i] - a[i] * a[i]) + eps);
      w[i] -= m[i];
    }
  }
}
using RmspropSpan = void (*)(float*, const float*, float*, float*, float*, int64_t, float, float, float, float, float);
void rmsprop_span_scalar(float* w, const float* g, float* v, float* m, float* a, int64_t n, float lr, float rho,
                         float omr, float mu, float eps) {
  rmsprop_span(w, g, v, m, a, n, lr, rho, omr, mu, eps);
}
[[gnu::target("avx2")]] void rmsprop_span_avx2(float* w, const float* g, float* v, float* m, float* a, int64_t n,
                                               float lr, float rho, float omr, float mu, float eps) {
  rmsprop_span(w, g, v, m, a, n, lr, rho, omr, mu, eps);
}
[[gnu::target("avx512f")]] void rmsprop_span_avx512(float* w, const float* g, float* v, float* m, float* a,
                                                    int64_t n, float lr, float rho, float omr, float mu, float eps) {
  rmsprop_span(w, g, v, m, a, n, lr, rho, omr, mu, eps);
}

void rmsprop_kernel(float* w, const float* g, float* v, float* m, float* a, int64_t n, float lr, float rho,
                    float one_minus_rho, float mu, float eps) {
  const RmspropSpan span =
      optim_detail::variant_for_isa<RmspropSpan>(rmsprop_span_scalar, rmsprop_span_avx2, rmsprop_span_avx512);
  optim_detail::for_each_span(n, kParallelMin, [&](int64_t begin, int64_t end) {
    span(w + begin, g + begin, v + begin, m ? m + begin : nullptr, a ? a + begin : nullptr, end - begin, lr, rho,
         one_minus_rho, mu, eps);
  });
}
}  // namespace

RMSprop::RMSprop(float learning_rate, RMSpropOptions options) : Optimizer(learning_rate), options_(options) {
  MIXTRAIN_CHECK(options.rho >= 0.0 && options.rho < 1.0, "rmsprop: rho must be in [0, 1), got " << options.rho);
  MIXTRAIN_CHECK(options.momentum >= 0.0 && options.momentum < 1.0,
                 "rmsprop: momentum must be in [0, 1), got " << options.momentum);
  MIXTRAIN_CHECK(std::isfinite(options.epsilon) && options.epsilon > 0.0f,
                 "rmsprop: epsilon must be finite and > 0, got " << options.epsilon);
}

std::vector<std::string> RMSprop::slot_names() const {
  // Keras creates the momentum and average-gradient variables only when they are used; so do we.
  std::vector<std::string> names{"velocity"};
  if (options_.momentum > 0.0) names.emplace_back("momentum");
  if (options_.centered) names.emplace_back("average_gradient");
  return names;
}

std::optional<ops::UpdateConstants> RMSprop::fused_rule() const {
  // update_span()'s constants, rounded as there.
  ops::UpdateConstants k;
  k.kind = ops::UpdateKind::kRmsprop;
  k.epsilon = options_.epsilon;
  k.momentum = static_cast<float>(options_.momentum);
  k.rho = static_cast<float>(options_.rho);
  k.one_minus_rho = static_cast<float>(1.0 - options_.rho);
  k.centered = options_.centered;
  return k;
}

void RMSprop::update_span(float* w, const float* g, float* const* slots, int64_t n, int /*cls*/) {
  const bool has_momentum = options_.momentum > 0.0;
  float* v = slots[0];
  float* m = has_momentum ? slots[1] : nullptr;
  float* a = options_.centered ? slots[has_momentum ? 2 : 1] : nullptr;
  rmsprop_kernel(w, g, v, m, a, n, learning_rate(), static_cast<float>(options_.rho),
                 static_cast<float>(1.0 - options_.rho), static_cast<float>(options_.momentum), options_.epsilon);
}

}  // namespace mixtrain
