// The FP8 recipes' quantization ops on a transformer's activation (2048 x 512 bfloat16, the main job's MLP input),
// beside the bfloat16 cast of the same values (the peer: what mixed_bfloat16 pays for an operand). Per-tensor:
// fp8_quantize (scale, encode, widen back, amax in one pass); MXFP8: mx_block_quantize along the rows and down the
// columns (the forward and the weight-gradient copies), mx_block_encode (the saved codes) and mx_block_decode (their
// widening in backward). Default threads. Report ratios to the peer.
#include <benchmark/benchmark.h>

#include <span>

#include "mixtrain/core/random.h"
#include "mixtrain/ops/transfer.h"
#include "mixtrain/ops/fp8_gemm.h"

namespace mixtrain {
namespace {

constexpr int64_t kRows = 2048, kCols = 512;

Tensor activation(DType dtype) {
  Rng r(1);
  Tensor x = Tensor::empty({kRows, kCols}, DType::kFloat32);
  for (float& v : std::span(x.data<float>(), static_cast<size_t>(x.numel()))) v = r.normal() * 3.0f;
  return x.to(dtype);
}

void finish(benchmark::State& state) { state.SetItemsProcessed(state.iterations() * kRows * kCols); }

void BM_bfloat16_cast_peer(benchmark::State& state) {
  const Tensor x = activation(DType::kFloat32);
  Tensor into = Tensor::empty({kRows, kCols}, DType::kBFloat16);
  for (auto _ : state) ops::cast_into(x, into);
  finish(state);
}

void BM_fp8_quantize(benchmark::State& state) {
  const Tensor x = activation(DType::kBFloat16);
  Tensor into = Tensor::empty({kRows, kCols}, DType::kBFloat16);
  for (auto _ : state) benchmark::DoNotOptimize(ops::fp8_quantize(x, DType::kFloat8E4M3FN, 2.0f,
                                                                 Float8Overflow::kSaturate, into).amax);
  finish(state);
}

void BM_mx_block_quantize(benchmark::State& state) {
  const Tensor x = activation(DType::kBFloat16);
  Tensor into = Tensor::empty({kRows, kCols}, DType::kBFloat16);
  for (auto _ : state) ops::mx_block_quantize(x, DType::kFloat8E4M3FN, state.range(0) != 0, into);
  state.SetLabel(state.range(0) ? "down the columns" : "along the rows");
  finish(state);
}

void BM_mx_block_encode(benchmark::State& state) {
  const Tensor x = activation(DType::kBFloat16);
  for (auto _ : state) benchmark::DoNotOptimize(ops::mx_block_encode(x, DType::kFloat8E4M3FN, true).codes);
  finish(state);
}

void BM_mx_block_decode(benchmark::State& state) {
  const ops::MxBlockCodes q = ops::mx_block_encode(activation(DType::kBFloat16), DType::kFloat8E4M3FN, true);
  Tensor into = Tensor::empty({kRows, kCols}, DType::kBFloat16);
  for (auto _ : state) ops::mx_block_decode(q, into);
  finish(state);
}

BENCHMARK(BM_bfloat16_cast_peer);
BENCHMARK(BM_fp8_quantize);
BENCHMARK(BM_mx_block_quantize)->Arg(0)->Arg(1);
BENCHMARK(BM_mx_block_encode);
BENCHMARK(BM_mx_block_decode);

}  // namespace
}  // namespace mixtrain

BENCHMARK_MAIN();
