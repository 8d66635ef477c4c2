// sum_rows (the bias gradient: dy (rows, cols) summed over its rows into float32) at training shapes, beside the
// row-order loop it replaced, measured in the same run:
//   BM_sum_rows:             ops::sum_rows: blocks of 64 rows summed in parallel, then the blocks in order.
//   BM_sum_rows_serial_peer: one thread, every row in turn converted to float32 and added (the former kernel, and
//                            the order a one-thread-per-column GPU kernel follows).
// Shapes: the transformer's dense layers (batch 32 x 83 positions, width 128), its MLP (32 x 64, 512) and the MLP's
// hidden layer (batch 256, 4096). Report ratios; an absolute time is only a note about this machine.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <string>
#include <vector>

#include "mixtrain/core/random.h"
#include "mixtrain/ops/elementwise.h"

namespace mixtrain {
namespace {

const DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
const int64_t kShapes[][2] = {{32 * 83, 128}, {32 * 64, 512}, {256, 4096}};

Tensor uniform_tensor(int64_t rows, int64_t cols, DType dtype) {
  Rng r(7);
  Tensor t = Tensor::empty({rows, cols}, DType::kFloat32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = r.uniform(-1.0f, 1.0f);
  return t.to(dtype);
}

void label(benchmark::State& state, int64_t rows, int64_t cols, DType dt) {
  state.SetLabel(std::to_string(rows) + "x" + std::to_string(cols) + " " + dtype_name(dt));
  state.SetBytesProcessed(state.iterations() * rows * cols * static_cast<int64_t>(dtype_size(dt)));
}

void BM_sum_rows(benchmark::State& state) {
  const int64_t rows = kShapes[state.range(0)][0], cols = kShapes[state.range(0)][1];
  const DType dt = kDTypes[state.range(1)];
  const Tensor dy = uniform_tensor(rows, cols, dt);
  for (auto _ : state) {
    Tensor s = ops::sum_rows(dy);
    benchmark::DoNotOptimize(s.raw());
  }
  label(state, rows, cols, dt);
}

void BM_sum_rows_serial_peer(benchmark::State& state) {
  const int64_t rows = kShapes[state.range(0)][0], cols = kShapes[state.range(0)][1];
  const DType dt = kDTypes[state.range(1)];
  const Tensor dy = uniform_tensor(rows, cols, dt);
  const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(dt);
  std::vector<float> out(static_cast<size_t>(cols)), row(static_cast<size_t>(cols));
  for (auto _ : state) {
    std::fill(out.begin(), out.end(), 0.0f);
    for (int64_t i = 0; i < rows; ++i) {
      convert_elements(static_cast<const char*>(dy.raw()) + i * row_bytes, dt, row.data(), DType::kFloat32, cols);
      for (int64_t j = 0; j < cols; ++j) out[static_cast<size_t>(j)] += row[static_cast<size_t>(j)];
    }
    benchmark::DoNotOptimize(out.data());
  }
  label(state, rows, cols, dt);
}

BENCHMARK(BM_sum_rows)->ArgsProduct({{0, 1, 2}, {0, 1, 2}});
BENCHMARK(BM_sum_rows_serial_peer)->ArgsProduct({{0, 1, 2}, {0, 1, 2}});

}  // namespace
}  // namespace mixtrain

BENCHMARK_MAIN();
