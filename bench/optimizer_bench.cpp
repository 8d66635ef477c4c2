// Optimizer step over the variables of an MLP 784-4096-4096-10 (19.3M parameters) under Adam: the
// per-variable apply() against apply_arena() over flat buffers, and the same with a float16 compute copy
// refreshed (per variable: value.to(float16), what Layer::read_weight does after each update). A third
// pair uses a convolutional network's many small variables (32 x (3x3x64x64 kernel, 64 gamma, 64 beta)),
// where a per-variable update is too small to use more than one thread. The 16-bit cases time the arena update of the
// same MLP as mixed_bfloat16 runs it (float32 master weights, a bfloat16 compute copy) with Adam's moments in float32
// or bfloat16 (AdamOptions::optimizer_state), rounded to nearest or stochastically, and of bfloat16 master weights.
// Run: build/bench/optimizer_bench --benchmark_min_time=1 ; compare the pairs as ratios.
#include <benchmark/benchmark.h>

#include <vector>

#include "mixtrain/optim/adam.h"
#include "mixtrain/optim/parameter_arena.h"

namespace mixtrain {
namespace {

std::vector<Var> cnn_vars() {
  std::vector<Var> vars;
  for (int b = 0; b < 32; ++b) {
    const std::string p = "conv_" + std::to_string(b);
    vars.emplace_back(Tensor::full({3, 3, 64, 64}, DType::kFloat32, 0.01f), true, p + "/kernel");
    vars.emplace_back(Tensor::full({64}, DType::kFloat32, 1.0f), true, p + "_bn/gamma");
    vars.emplace_back(Tensor::full({64}, DType::kFloat32, 0.0f), true, p + "_bn/beta");
  }
  return vars;
}

std::vector<Var> mlp_vars(DType dtype = DType::kFloat32) {
  const std::vector<std::pair<std::string, Shape>> shapes = {
      {"dense/kernel", {784, 4096}},   {"dense/bias", {4096}},   {"dense_1/kernel", {4096, 4096}},
      {"dense_1/bias", {4096}},        {"dense_2/kernel", {4096, 10}}, {"dense_2/bias", {10}}};
  std::vector<Var> vars;
  for (const auto& [name, shape] : shapes) {
    Var v(Tensor::full(shape, dtype, 0.01f), true, name);
    vars.push_back(v);
  }
  return vars;
}

void give_grads(std::vector<Var>& vars) {
  for (Var& v : vars) v.accumulate_grad(Tensor::full(v.shape(), DType::kFloat32, 1e-3f));
}

int64_t param_count(const std::vector<Var>& vars) {
  int64_t n = 0;
  for (const Var& v : vars) n += v.value().numel();
  return n;
}

void BM_AdamPerVariable(benchmark::State& state, bool cast, bool cnn = false) {
  std::vector<Var> vars = cnn ? cnn_vars() : mlp_vars();
  give_grads(vars);
  std::vector<Tensor> grads;
  for (const Var& v : vars) grads.push_back(v.grad());
  Adam opt(1e-4f);
  for (auto _ : state) {
    opt.apply(grads, vars);
    if (cast) {
      for (const Var& v : vars) benchmark::DoNotOptimize(v.value().to(DType::kFloat16));
    }
  }
  state.counters["params/s"] =
      benchmark::Counter(static_cast<double>(param_count(vars)), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_AdamArena(benchmark::State& state, bool cast, bool cnn = false) {
  std::vector<Var> vars = cnn ? cnn_vars() : mlp_vars();
  ParameterArena arena(vars);
  if (cast) arena.enable_compute_copy(DType::kFloat16);
  give_grads(vars);
  Adam opt(1e-4f);
  for (auto _ : state) {
    opt.apply_arena(arena);
    benchmark::ClobberMemory();
  }
  state.counters["params/s"] =
      benchmark::Counter(static_cast<double>(param_count(vars)), benchmark::Counter::kIsIterationInvariantRate);
}

// weights: float32 (with a bfloat16 compute copy, as mixed_bfloat16) or bfloat16; moments: float32 or bfloat16.
void BM_AdamArena16(benchmark::State& state, DType weights, DType moments, bool stochastic) {
  std::vector<Var> vars = mlp_vars(weights);
  ParameterArena arena(vars);
  if (weights == DType::kFloat32) arena.enable_compute_copy(DType::kBFloat16);
  give_grads(vars);
  AdamOptions o;
  o.optimizer_state = moments;
  o.stochastic_rounding = stochastic;
  Adam opt(1e-4f, o);
  for (auto _ : state) {
    opt.apply_arena(arena);
    benchmark::ClobberMemory();
  }
  state.counters["params/s"] =
      benchmark::Counter(static_cast<double>(param_count(vars)), benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK_CAPTURE(BM_AdamPerVariable, float32, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_AdamArena, float32, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_AdamPerVariable, with_float16_cast, true)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_AdamArena, with_float16_copy, true)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_AdamPerVariable, cnn_float32, false, true)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_AdamArena, cnn_float32, false, true)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_AdamArena16, mixed_bfloat16, DType::kFloat32, DType::kFloat32, false)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_AdamArena16, mixed_bfloat16_state_nearest, DType::kFloat32, DType::kBFloat16, false)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_AdamArena16, mixed_bfloat16_state_stochastic, DType::kFloat32, DType::kBFloat16, true)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_AdamArena16, bfloat16_weights_nearest, DType::kBFloat16, DType::kFloat32, false)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_AdamArena16, bfloat16_weights_stochastic, DType::kBFloat16, DType::kFloat32, true)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_AdamArena16, bfloat16_all_stochastic, DType::kBFloat16, DType::kBFloat16, true)
    ->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace mixtrain

BENCHMARK_MAIN();
