// global_norm and clip_by_global_norm (declared in optimizer.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "mixtrain/optim/optimizer.h"

namespace mixtrain {

namespace {

// Fixed-size chunks summed in a fixed order: the norm is the same bit for bit whatever the thread count.
constexpr int64_t kChunk = int64_t{1} << 16;

template <typename T>
double sum_squares(const T* x, int64_t n) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for if (chunks > 1) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
    double s = 0.0;
    for (int64_t i = c * kChunk; i < end; ++i) {
      const double v = to_float(x[i]);
      s += v * v;
    }
    partial[static_cast<size_t>(c)] = s;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace

float global_norm(const std::vector<Tensor>& grads) {
  double total = 0.0;
  for (const Tensor& g : grads) {
    if (!g.defined()) continue;
    total += dispatch_float(g.dtype(), "global_norm", [&](auto tag) {
      using T = decltype(tag);
      return sum_squares(g.data<T>(), g.numel());
    });
  }
  return static_cast<float>(std::sqrt(total));
}

void clip_by_global_norm(std::vector<Tensor>& grads, float clip_norm) {
  MIXTRAIN_CHECK(std::isfinite(clip_norm) && clip_norm > 0.0f,
                 "clip_by_global_norm: clip_norm must be finite and > 0, got " << clip_norm);
  const float norm = global_norm(grads);
  if (std::isfinite(norm) && norm <= clip_norm) return;
  const float scale = std::isfinite(norm) ? static_cast<float>(static_cast<double>(clip_norm) / norm)
                                          : std::numeric_limits<float>::quiet_NaN();
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
