// The optimizer rules' element updates on a span of float32 host elements (ops::update_span): SGD (with or without
// momentum, Nesterov), RMSprop (momentum, centered), Adam and AdamW's decay, each in its optimizer's operations and
// order (Keras' formulations, optim/sgd.h, optim/rmsprop.h, optim/adam.h). The fused update's CPU kernel runs them on
// each block of a run; an optimizer's update variable by variable runs them on a whole variable. The device's
// element functions (ops/shared/fused_update_element.h) give the same bits, which tests/ops/cuda_shared_math_test.cpp
// checks at every instruction-set level.
#include <cmath>
#include <cstdint>

#include "mixtrain/ops/fused_update.h"
#include "update_isa_variants.h"

namespace mixtrain::ops::cpu {

namespace {
// Below this many elements a thread team costs more than it saves.
constexpr int64_t kParallelMin = int64_t{1} << 16;

// The Adam update is a square root and a division per element: compute-bound at the baseline's 4-wide SSE, so
// it runs in the widest variant the instruction-set level allows (update_isa_variants.h).
//
// The four streams are prefetched a few cache lines ahead: the square root and the division hold the
// out-of-order window long enough that the hardware prefetchers alone leave the loads waiting on memory
// (bench/optimizer_bench BM_AdamArena/float32, 20M weights, 2 threads of this machine kind's Xeon, alternating
// runs: 20.6-21.6 ms without, 18.4-18.9 ms with).
[[gnu::always_inline]] inline void adam_span(float* w, const float* g, float* m, float* v, int64_t n, float alpha,
                                             float one_minus_b1, float one_minus_b2, float eps) {
  constexpr int64_t kLine = 16, kAhead = 256;  // floats per cache line; how far ahead to prefetch
  for (int64_t i0 = 0; i0 < n; i0 += kLine) {
    __builtin_prefetch(w + i0 + kAhead, 1);
    __builtin_prefetch(g + i0 + kAhead, 0);
    __builtin_prefetch(m + i0 + kAhead, 1);
    __builtin_prefetch(v + i0 + kAhead, 1);
    const int64_t i1 = i0 + kLine < n ? i0 + kLine : n;
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      m[i] += (g[i] - m[i]) * one_minus_b1;
      v[i] += (g[i] * g[i] - v[i]) * one_minus_b2;
      w[i] -= (m[i] * alpha) / (std::sqrt(v[i]) + eps);
    }
  }
}
using AdamSpan = void (*)(float*, const float*, float*, float*, int64_t, float, float, float, float);
void adam_span_scalar(float* w, const float* g, float* m, float* v, int64_t n, float a, float b1, float b2, float e) {
  adam_span(w, g, m, v, n, a, b1, b2, e);
}
[[gnu::target("avx2")]] void adam_span_avx2(float* w, const float* g, float* m, float* v, int64_t n, float a,
                                            float b1, float b2, float e) {
  adam_span(w, g, m, v, n, a, b1, b2, e);
}
[[gnu::target("avx512f")]] void adam_span_avx512(float* w, const float* g, float* m, float* v, int64_t n, float a,
                                                 float b1, float b2, float e) {
  adam_span(w, g, m, v, n, a, b1, b2, e);
}

void adam_kernel(float* w, const float* g, float* m, float* v, int64_t n, float alpha, float one_minus_b1,
                 float one_minus_b2, float eps) {
  const AdamSpan span = for_isa_level<AdamSpan>(adam_span_scalar, adam_span_avx2, adam_span_avx512);
  for_each_span(n, kParallelMin, [&](int64_t begin, int64_t end) {
    span(w + begin, g + begin, m + begin, v + begin, end - begin, alpha, one_minus_b1, one_minus_b2, eps);
  });
}

// A square root and a division per element, like Adam: compute-bound at the baseline's 4-wide SSE, so it runs in
// the widest variant the instruction-set level allows. m is null without momentum, a is null unless centered; each
// case is its own loop so each vectorises.
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
  const RmspropSpan span = for_isa_level<RmspropSpan>(rmsprop_span_scalar, rmsprop_span_avx2, rmsprop_span_avx512);
  for_each_span(n, kParallelMin, [&](int64_t begin, int64_t end) {
    span(w + begin, g + begin, v + begin, m ? m + begin : nullptr, a ? a + begin : nullptr, end - begin, lr, rho,
         one_minus_rho, mu, eps);
  });
}

// SGD: memory-bound, so the baseline's loops; w -= g lr, or through the momentum v = v mu - g lr.
void sgd_kernel(float* w, const float* g, float* v, int64_t n, float lr, float mu, bool nesterov) {
  if (v == nullptr) {
#pragma omp parallel for simd if (n >= kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) w[i] -= g[i] * lr;
    return;
  }
  if (nesterov) {
#pragma omp parallel for simd if (n >= kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      v[i] = v[i] * mu - g[i] * lr;
      w[i] += v[i] * mu - g[i] * lr;
    }
  } else {
#pragma omp parallel for simd if (n >= kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      v[i] = v[i] * mu - g[i] * lr;
      w[i] += v[i];
    }
  }
}

// AdamW's decoupled weight decay, before the Adam step. Same association as Keras (w - w * wd * lr) so results
// match it bit for bit in float32.
void adamw_decay_kernel(float* w, int64_t n, float wd, float lr) {
#pragma omp parallel for simd if (n >= kParallelMin) schedule(static)
  for (int64_t i = 0; i < n; ++i) w[i] = w[i] - w[i] * wd * lr;
}

}  // namespace

void update_span(const UpdateConstants& rule, const UpdateRates& rates, float* w, const float* g,
                 float* const* slots, int64_t n, int cls) {
  const float lr = rates.learning_rate;
  switch (rule.kind) {
    case UpdateKind::kSgd:
      sgd_kernel(w, g, rule.momentum == 0.0f ? nullptr : slots[0], n, lr, rule.momentum, rule.nesterov);
      return;
    case UpdateKind::kAdam:
      if (cls == 1) adamw_decay_kernel(w, n, rule.weight_decay, lr);
      adam_kernel(w, g, slots[0], slots[1], n, rates.alpha, rule.one_minus_beta1, rule.one_minus_beta2, rule.epsilon);
      return;
    case UpdateKind::kRmsprop: {
      const bool has_momentum = rule.momentum > 0.0f;
      float* m = has_momentum ? slots[1] : nullptr;
      float* a = rule.centered ? slots[has_momentum ? 2 : 1] : nullptr;
      rmsprop_kernel(w, g, slots[0], m, a, n, lr, rule.rho, rule.one_minus_rho, rule.momentum, rule.epsilon);
      return;
    }
  }
}

}  // namespace mixtrain::ops::cpu
