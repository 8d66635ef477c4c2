// Convolution speed per compute dtype, each beside a peer measured in the same run:
//   BM_conv2d_step:     one Conv2D training step (forward, then dx, dkernel and dbias) of the Fashion CNN's
//                       second convolution, 3x3, 32 -> 64 channels, "same", on (256, 14, 14, 32).
//   BM_conv2d_gemm_peer: the three GEMMs of that step alone (same shapes, preallocated operands): the
//                       ratio step / peer is what im2col, col2im and the bias sums cost on top.
//   BM_cnn_step:        forward and backward of the whole CNN (Conv32-BN-ReLU-Pool, Conv64-BN-ReLU-Pool,
//                       Dense 10) on a batch of 256 28x28x1 images, per policy; the float32 run is the
//                       peer of the mixed ones.
// Report ratios; an absolute time is only a note about this machine.
#include <benchmark/benchmark.h>

#include <memory>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/core/random.h"
#include "mixtrain/kernels/gemm.h"
#include "mixtrain/nn/conv_layers.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/normalization.h"
#include "mixtrain/nn/reshaping.h"
#include "mixtrain/ops/conv2d.h"
#include "mixtrain/precision/hardware_check.h"

namespace mixtrain {
namespace {

const DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
const char* kPolicies[] = {"float32", "mixed_float16", "mixed_bfloat16"};

constexpr int64_t kBatch = 256, kSide = 14, kCin = 32, kCout = 64, kK = 3;

Tensor random_tensor(const Shape& shape, uint64_t seed, DType dtype) {
  Rng r(seed);
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = r.uniform(-1.0f, 1.0f);
  return t.to(dtype);
}

// Multiply-adds of one forward convolution; a training step does three times as many.
double step_flops() { return 2.0 * 3.0 * kBatch * kSide * kSide * kK * kK * kCin * kCout; }

void BM_conv2d_step(benchmark::State& state) {
  const DType dt = kDTypes[state.range(0)];
  const Tensor x = random_tensor({kBatch, kSide, kSide, kCin}, 1, dt);
  const Tensor w = random_tensor({kK, kK, kCin, kCout}, 2, dt);
  const Tensor b = random_tensor({kCout}, 3, DType::kFloat32);
  const Tensor dy = random_tensor({kBatch, kSide, kSide, kCout}, 4, dt);
  const ops::Conv2dOptions o{1, ops::Padding::kSame};
  for (auto _ : state) {
    Tensor y = ops::conv2d(x, w, b, o);
    ops::Conv2dGrads g = ops::conv2d_backward(dy, x, w, o, true, true);
    benchmark::DoNotOptimize(y.raw());
    benchmark::DoNotOptimize(g.dx.raw());
  }
  state.SetLabel(dtype_name(dt));
  state.counters["GFLOP/s"] =
      benchmark::Counter(step_flops(), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void BM_conv2d_gemm_peer(benchmark::State& state) {
  const DType dt = kDTypes[state.range(0)];
  const int64_t m = kBatch * kSide * kSide, k = kK * kK * kCin, n = kCout;
  const Tensor col = random_tensor({m, k}, 1, dt), w = random_tensor({k, n}, 2, dt), dy = random_tensor({m, n}, 4, dt);
  const Tensor b = random_tensor({n}, 3, DType::kFloat32);
  Tensor y = Tensor::empty({m, n}, dt), dcol = Tensor::empty({m, k}, DType::kFloat32),
         dw = Tensor::empty({k, n}, DType::kFloat32);
  for (auto _ : state) {
    kernels::gemm(false, false, m, n, k, dt, col.raw(), k, w.raw(), n, dt, y.raw(), n, false, b.data<float>());
    kernels::gemm(false, true, m, k, n, dt, dy.raw(), n, w.raw(), n, DType::kFloat32, dcol.raw(), k, false, nullptr);
    kernels::gemm(true, false, k, n, m, dt, col.raw(), k, dy.raw(), n, DType::kFloat32, dw.raw(), n, false, nullptr);
    benchmark::DoNotOptimize(dw.raw());
  }
  state.SetLabel(dtype_name(dt));
  state.counters["GFLOP/s"] =
      benchmark::Counter(step_flops(), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void BM_cnn_step(benchmark::State& state) {
  set_precision_warning_sink([](const std::string&) {});
  const char* policy = kPolicies[state.range(0)];
  set_global_policy(policy);
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::make_unique<Reshape>(std::vector<int64_t>{28, 28, 1}));
  layers.push_back(std::make_unique<Conv2D>(32, 3, 1, "same"));
  layers.push_back(std::make_unique<BatchNormalization>());
  layers.push_back(std::make_unique<Activation>("relu"));
  layers.push_back(std::make_unique<MaxPooling2D>());
  layers.push_back(std::make_unique<Conv2D>(64, 3, 1, "same"));
  layers.push_back(std::make_unique<BatchNormalization>());
  layers.push_back(std::make_unique<Activation>("relu"));
  layers.push_back(std::make_unique<MaxPooling2D>());
  layers.push_back(std::make_unique<Flatten>());
  layers.push_back(std::make_unique<Dense>(10, "linear", dtype_arg("float32")));
  set_global_policy("float32");
  const DType compute = layers.front()->compute_dtype();
  const Tensor x = random_tensor({kBatch, 784}, 5, compute);
  std::vector<int32_t> labels(static_cast<size_t>(kBatch));
  Rng r(6);
  for (auto& l : labels) l = static_cast<int32_t>(r.below(10));
  const Tensor y = Tensor::from_ints({kBatch}, labels);
  auto step = [&]() {
    Var h(x);
    for (auto& l : layers) h = (*l)(h, CallContext{true, &r});
    backward(sparse_categorical_crossentropy(h, y, true));
    for (auto& l : layers)
      for (Var w : l->trainable_weights()) w.zero_grad();
  };
  step();  // builds the layers
  for (auto _ : state) step();
  state.SetLabel(policy);
}

BENCHMARK(BM_conv2d_step)->DenseRange(0, 2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_conv2d_gemm_peer)->DenseRange(0, 2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_cnn_step)->DenseRange(0, 2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace mixtrain

BENCHMARK_MAIN();
