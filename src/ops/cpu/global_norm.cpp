// CPU kernel of global_norm: each tensor's squares summed in double over fixed-size chunks (in parallel), the chunks
// and then the tensors added in order, so the norm is the same bit for bit whatever the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "mixtrain/ops/global_norm.h"
#include "cpu_backend.h"

namespace mixtrain::ops::cpu {

namespace {

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

void global_norm(const std::vector<Tensor>& xs, Tensor& out) {
  double total = 0.0;
  for (const Tensor& x : xs) {
    total += dispatch_float(x.dtype(), "global_norm", [&](auto tag) {
      using T = decltype(tag);
      return sum_squares(x.data<T>(), x.numel());
    });
  }
  out.data<float>()[0] = static_cast<float>(std::sqrt(total));
}

void register_global_norm_kernels(Kernels& k) {
  k.set<Op::global_norm>(&global_norm);
}

}  // namespace mixtrain::ops::cpu
