// Attention speed per policy, beside a peer measured in the same run:
//   BM_mha_step:     forward and backward of one MultiHeadAttention layer (4 heads of 32, D = 128) on
//                    x (32, 128, 128), not causal and causal, per policy (float32 is the peer of the mixed
//                    ones).
//   BM_mha_gemm_peer: the GEMMs of that step alone, per compute dtype, on preallocated operands of the same
//                    shapes (the four projections forward and backward, and the per-head products run as
//                    batched products): the ratio step / peer is what the softmax rows, the casts, the
//                    reshapes and the tape cost on top.
//   BM_attention_op: the causal bfloat16 attention op alone, forward and backward, on (8, T, 8 x 32) q, k, v
//                    (the issue-43 step's shape), full (scaled_dot_product_attention, keeping the
//                    probabilities) against tiled (flash_attention), T from 64 to 1024.
//   BM_attention_backward: the backward of that op alone, full against tiled, T from 192 to 512.
//   BM_attention_forward: the forward of that op alone, full against tiled, T from 192 to 1024.
// Report ratios; an absolute time is only a note about this machine.
#include <benchmark/benchmark.h>

#include <cmath>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/core/random.h"
#include "mixtrain/kernels/gemm.h"
#include "mixtrain/nn/transformer_layers.h"
#include "mixtrain/ops/flash_attention.h"
#include "mixtrain/ops/matmul.h"
#include "mixtrain/precision/hardware_check.h"

namespace mixtrain {
namespace {

const char* kPolicies[] = {"float32", "mixed_float16", "mixed_bfloat16"};
const DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

constexpr int64_t kBatch = 32, kT = 128, kD = 128, kHeads = 4, kKeyDim = 32;

Tensor random_tensor(const Shape& shape, uint64_t seed, DType dtype) {
  Rng r(seed);
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = r.uniform(-1.0f, 1.0f);
  return t.to(dtype);
}

// Multiply-adds of the forward pass (four projections, q k^T and p v); a step does three times as many.
double step_flops() {
  const double projections = 4.0 * kBatch * kT * kD * kD;
  const double attention = 2.0 * kBatch * kHeads * kT * kT * kKeyDim;
  return 2.0 * 3.0 * (projections + attention);
}

void BM_mha_step(benchmark::State& state) {
  set_precision_warning_sink([](const std::string&) {});
  const char* policy = kPolicies[state.range(0)];
  const bool causal = state.range(1) != 0;
  set_global_policy(policy);
  MultiHeadAttention mha({.num_heads = kHeads, .key_dim = kKeyDim, .causal = causal});
  set_global_policy("float32");
  const Tensor x = random_tensor({kBatch, kT, kD}, 1, mha.compute_dtype());
  Rng rng(2);
  auto step = [&]() {
    Var in(x, /*requires_grad=*/true);  // so the input gradient is computed too, as inside a model
    Var y = mha(in, CallContext{true, &rng});
    backward(sum(y));
    for (Var w : mha.trainable_weights()) w.zero_grad();
  };
  step();  // builds the layer
  for (auto _ : state) step();
  state.SetLabel(std::string(policy) + (causal ? " causal" : ""));
  state.counters["GFLOP/s"] =
      benchmark::Counter(step_flops(), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void BM_mha_gemm_peer(benchmark::State& state) {
  const DType dt = kDTypes[state.range(0)];
  const int64_t rows = kBatch * kT, pairs = kBatch * kHeads;
  const Tensor x = random_tensor({rows, kD}, 1, dt), w = random_tensor({kD, kD}, 2, dt), dy = random_tensor({rows, kD}, 3, dt);
  const Tensor q = random_tensor({pairs, kT, kKeyDim}, 4, dt), k = random_tensor({pairs, kT, kKeyDim}, 5, dt);
  const Tensor p = random_tensor({pairs, kT, kT}, 6, dt), ds = random_tensor({pairs, kT, kT}, 7, DType::kFloat32);
  const Tensor q32 = q.to(DType::kFloat32), k32 = k.to(DType::kFloat32);
  Tensor y = Tensor::empty({rows, kD}, dt), dx = Tensor::empty({rows, kD}, dt), dw = Tensor::empty({kD, kD}, DType::kFloat32);
  for (auto _ : state) {
    for (int proj = 0; proj < 4; ++proj) {  // forward, dx, dw of each projection
      kernels::gemm(false, false, rows, kD, kD, dt, x.raw(), kD, w.raw(), kD, dt, y.raw(), kD, false, nullptr);
      kernels::gemm(false, true, rows, kD, kD, dt, dy.raw(), kD, w.raw(), kD, dt, dx.raw(), kD, false, nullptr);
      kernels::gemm(true, false, kD, kD, rows, dt, x.raw(), kD, dy.raw(), kD, DType::kFloat32, dw.raw(), kD, false,
                    nullptr);
    }
    // Per head: s = q k^T and o = p v forward; dp = do v^T, dv = p^T do, dq = ds k, dk = ds^T q backward.
    benchmark::DoNotOptimize(ops::bmm(q, k, false, true, DType::kFloat32).raw());
    benchmark::DoNotOptimize(ops::bmm(p, k).raw());
    benchmark::DoNotOptimize(ops::bmm(q, k, false, true, DType::kFloat32).raw());
    benchmark::DoNotOptimize(ops::bmm(p, q, true, false).raw());
    benchmark::DoNotOptimize(ops::bmm(ds, k32, false, false, dt).raw());
    benchmark::DoNotOptimize(ops::bmm(ds, q32, true, false, dt).raw());
    benchmark::DoNotOptimize(dw.raw());
  }
  state.SetLabel(dtype_name(dt));
  state.counters["GFLOP/s"] =
      benchmark::Counter(step_flops(), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

// state.range(0): 0 full, 1 tiled; state.range(1): T.
void BM_attention_op(benchmark::State& state) {
  const bool tiled = state.range(0) == 1;
  const int64_t t = state.range(1), b = 8, h = 8, d = 32;
  const Tensor q = random_tensor({b, t, h * d}, 1, DType::kBFloat16), k = random_tensor({b, t, h * d}, 2, DType::kBFloat16);
  const Tensor v = random_tensor({b, t, h * d}, 3, DType::kBFloat16), dout = random_tensor({b, t, h * d}, 4, DType::kBFloat16);
  ops::AttentionOptions o;
  o.num_heads = h;
  o.causal = true;
  o.scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (auto _ : state) {
    if (tiled) {
      const ops::FlashAttentionOutput a = ops::flash_attention(q, k, v, o);
      benchmark::DoNotOptimize(ops::flash_attention_backward(dout, q, k, v, a.out, a.lse, o).dq.raw());
    } else {
      const ops::AttentionOutput a = ops::scaled_dot_product_attention(q, k, v, o);
      benchmark::DoNotOptimize(ops::scaled_dot_product_attention_backward(dout, q, k, v, a.probs, o).dq.raw());
    }
  }
  state.SetLabel(tiled ? "tiled" : "full");
}

// The forward alone, same shapes and arguments.
void BM_attention_forward(benchmark::State& state) {
  const bool tiled = state.range(0) == 1;
  const int64_t t = state.range(1), b = 8, h = 8, d = 32;
  const Tensor q = random_tensor({b, t, h * d}, 1, DType::kBFloat16), k = random_tensor({b, t, h * d}, 2, DType::kBFloat16);
  const Tensor v = random_tensor({b, t, h * d}, 3, DType::kBFloat16);
  ops::AttentionOptions o;
  o.num_heads = h;
  o.causal = true;
  o.scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (auto _ : state) {
    if (tiled)
      benchmark::DoNotOptimize(ops::flash_attention(q, k, v, o).out.raw());
    else
      benchmark::DoNotOptimize(ops::scaled_dot_product_attention(q, k, v, o).out.raw());
  }
  state.SetLabel(tiled ? "tiled" : "full");
}

// The backward alone, same shapes and arguments (the forward runs once, outside the timing).
void BM_attention_backward(benchmark::State& state) {
  const bool tiled = state.range(0) == 1;
  const int64_t t = state.range(1), b = 8, h = 8, d = 32;
  const Tensor q = random_tensor({b, t, h * d}, 1, DType::kBFloat16), k = random_tensor({b, t, h * d}, 2, DType::kBFloat16);
  const Tensor v = random_tensor({b, t, h * d}, 3, DType::kBFloat16), dout = random_tensor({b, t, h * d}, 4, DType::kBFloat16);
  ops::AttentionOptions o;
  o.num_heads = h;
  o.causal = true;
  o.scale = 1.0f / std::sqrt(static_cast<float>(d));
  const ops::FlashAttentionOutput f = ops::flash_attention(q, k, v, o);
  const ops::AttentionOutput a = ops::scaled_dot_product_attention(q, k, v, o);
  for (auto _ : state) {
    if (tiled)
      benchmark::DoNotOptimize(ops::flash_attention_backward(dout, q, k, v, f.out, f.lse, o).dq.raw());
    else
      benchmark::DoNotOptimize(ops::scaled_dot_product_attention_backward(dout, q, k, v, a.probs, o).dq.raw());
  }
  state.SetLabel(tiled ? "tiled" : "full");
}

BENCHMARK(BM_attention_op)->ArgsProduct({{0, 1}, {64, 256, 512, 1024}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_attention_forward)->ArgsProduct({{0, 1}, {192, 256, 512, 1024}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_attention_backward)->ArgsProduct({{0, 1}, {192, 256, 384, 512}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_mha_step)->ArgsProduct({{0, 1, 2}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_mha_gemm_peer)->DenseRange(0, 2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace mixtrain

BENCHMARK_MAIN();
