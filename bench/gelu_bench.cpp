// GELU speed (the exact erf form) on the transformer's MLP activation, x (32, 64, 512), beside peers measured
// in the same run:
//   BM_gelu:           ops::activation and ops::activation_backward with GELU (forward + backward), per dtype.
//   BM_relu_peer:      the same two calls with ReLU: the same memory traffic and conversions with almost no
//                      arithmetic, so gelu / relu is what GELU's arithmetic costs on top of moving the data.
//   BM_gelu_libm_peer: GELU forward + backward in float32 with the C library's erff and expf in a plain loop
//                      (the formula the kernel had before its vectorized form), on one thread.
// Run with OMP_NUM_THREADS=1 to compare with the one-thread libm peer. Report ratios; an absolute time is only
// a note about this machine.
#include <benchmark/benchmark.h>

#include <cmath>
#include <vector>

#include "mixtrain/core/random.h"
#include "mixtrain/ops/elementwise.h"

namespace mixtrain {
namespace {

const DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
const Shape kShape{32, 64, 512};  // batch, context, MLP width (4 * 128)
constexpr int64_t kElements = 32 * 64 * 512;

// Standard normal values, as pre-activations of a trained layer roughly are: the libm functions take
// longer paths for large |x|, so uniform values on a wide range would flatter the vectorized kernel.
Tensor normal_tensor(uint64_t seed, DType dtype) {
  Rng r(seed);
  Tensor t = Tensor::empty(kShape, DType::kFloat32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = r.normal();
  return t.to(dtype);
}

void activation_step(benchmark::State& state, ops::Activation a) {
  const DType dt = kDTypes[state.range(0)];
  const Tensor x = normal_tensor(1, dt), dy = normal_tensor(2, dt);
  for (auto _ : state) {
    Tensor y = ops::activation(x, a);
    Tensor dx = ops::activation_backward(dy, x, y, a);
    benchmark::DoNotOptimize(dx.raw());
  }
  state.SetLabel(dtype_name(dt));
  state.SetItemsProcessed(state.iterations() * kElements);
}

void BM_gelu(benchmark::State& state) { activation_step(state, ops::Activation::kGelu); }
void BM_relu_peer(benchmark::State& state) { activation_step(state, ops::Activation::kRelu); }

void BM_gelu_libm_peer(benchmark::State& state) {
  const Tensor xt = normal_tensor(1, DType::kFloat32), dyt = normal_tensor(2, DType::kFloat32);
  const float* x = xt.data<float>();
  const float* dy = dyt.data<float>();
  std::vector<float> y(kElements), dx(kElements);
  for (auto _ : state) {
    for (int64_t i = 0; i < kElements; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678f));
    for (int64_t i = 0; i < kElements; ++i) {
      const float cdf = 0.5f * (1.0f + std::erf(x[i] * 0.70710678f));
      const float pdf = 0.39894228f * std::exp(-0.5f * x[i] * x[i]);
      dx[i] = dy[i] * (cdf + x[i] * pdf);
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::DoNotOptimize(dx.data());
  }
  state.SetLabel("float32");
  state.SetItemsProcessed(state.iterations() * kElements);
}

BENCHMARK(BM_gelu)->DenseRange(0, 2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_relu_peer)->DenseRange(0, 2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_gelu_libm_peer)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace mixtrain

BENCHMARK_MAIN();
