// One training step of the Fashion-MNIST MLP (784-256-128-10, Adam, batch 128: the CLI's defaults) and of
// the wide MLP (784-4096-4096-10, batch 256), per policy. Report ratios between policies from one run.
#include <benchmark/benchmark.h>

#include "mixtrain/nn/layers.h"
#include "mixtrain/precision/hardware_check.h"
#include "mixtrain/train/model.h"

namespace mixtrain {
namespace {

const char* kPolicies[] = {"float32", "mixed_float16", "mixed_bfloat16"};

void train_step(benchmark::State& state, std::vector<int64_t> hidden, int64_t batch) {
  set_precision_warning_sink([](const std::string&) {});
  const char* policy = kPolicies[state.range(0)];
  set_global_policy(policy);
  Model m("mlp", 1);
  for (int64_t h : hidden) m.emplace<Dense>(h, "relu");
  m.emplace<Dense>(10, "linear", dtype_arg("float32"));
  set_global_policy("float32");
  m.compile(make_optimizer("adam", 1e-3f), Loss("sparse_categorical_crossentropy", true));
  Rng r(1);
  Tensor x = Tensor::empty({batch, 784}, DType::kFloat32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = r.uniform();
  std::vector<int32_t> labels(static_cast<size_t>(batch));
  for (auto& l : labels) l = static_cast<int32_t>(r.below(10));
  Tensor y = Tensor::from_ints({batch}, labels);
  Tensor xb = x.to(m.layers().front()->compute_dtype());  // as fit() gathers it
  m.train_step(xb, y);                                     // optimizer slots and caches
  for (auto _ : state) m.train_step(xb, y);
  int64_t weights = 0;
  for (const Var& w : m.trainable_weights()) weights += w.value().numel();
  state.SetLabel(policy);
  state.counters["GFLOP/s"] = benchmark::Counter(6.0 * static_cast<double>(batch * weights),
                                                 benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}

void BM_train_step_mlp_256_128(benchmark::State& s) { train_step(s, {256, 128}, 128); }
void BM_train_step_mlp_4096_4096(benchmark::State& s) { train_step(s, {4096, 4096}, 256); }

BENCHMARK(BM_train_step_mlp_256_128)->DenseRange(0, 2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_train_step_mlp_4096_4096)->DenseRange(0, 2)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);

}  // namespace
}  // namespace mixtrain

BENCHMARK_MAIN();
