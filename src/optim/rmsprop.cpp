#include "mixtrain/optim/rmsprop.h"

#include <cmath>

namespace mixtrain {

namespace {
// Below this many elements a thread team costs more than it saves.
constexpr int64_t kParallelMin = int64_t{1} << 16;

// A square root and a division per element, like Adam: compute-bound at the baseline's 4-wide SSE, so clones
// for AVX-512 and AVX2 are chosen when the program loads. Without FMA contraction (ISO C++ mode) every clone
// gives the same bits. m is null without momentum, a is null unless centered; each case is its own loop so
// each vectorises.
__attribute__((target_clones("avx512f", "avx2", "default"))) void rmsprop_kernel(
    float* w, const float* g, float* v, float* m, float* a, int64_t n, float lr, float rho, float one_minus_rho,
    float mu, float eps) {
  if (a == nullptr && m == nullptr) {
#pragma omp parallel for simd if (n >= kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      v[i] = rho * v[i] + one_minus_rho * (g[i] * g[i]);
      w[i] -= (lr * g[i]) / std::sqrt(v[i] + eps);
    }
  } else if (a == nullptr) {
#pragma omp parallel for simd if (n >= kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      v[i] = rho * v[i] + one_minus_rho * (g[i] * g[i]);
      m[i] = mu * m[i] + (lr * g[i]) / std::sqrt(v[i] + eps);
      w[i] -= m[i];
    }
  } else if (m == nullptr) {
#pragma omp parallel for simd if (n >= kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      v[i] = rho * v[i] + one_minus_rho * (g[i] * g[i]);
      a[i] = rho * a[i] + one_minus_rho * g[i];
      w[i] -= (lr * g[i]) / std::sqrt((v[i] - a[i] * a[i]) + eps);
    }
  } else {
#pragma omp parallel for simd if (n >= kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      v[i] = rho * v[i] + one_minus_rho * (g[i] * g[i]);
      a[i] = rho * a[i] + one_minus_rho * g[i];
      m[i] = mu * m[i] + (lr * g[i]) / std::sqrt((v[i] - a[i] * a[i]) + eps);
      w[i] -= m[i];
    }
  }
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

void RMSprop::update_span(float* w, const float* g, float* const* slots, int64_t n, int /*cls*/) {
  const bool has_momentum = options_.momentum > 0.0;
  float* v = slots[0];
  float* m = has_momentum ? slots[1] : nullptr;
  float* a = options_.centered ? slots[has_momentum ? 2 : 1] : nullptr;
  rmsprop_kernel(w, g, v, m, a, n, learning_rate(), static_cast<float>(options_.rho),
                 static_cast<float>(1.0 - options_.rho), static_cast<float>(options_.momentum), options_.epsilon);
}

}  // namespace mixtrain
