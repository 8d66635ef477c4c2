// Layer normalization, forward and backward, at training shapes, beside the row-order kernel it replaced, measured
// in the same run:
//   BM_layer_norm:                ops::layer_norm then ops::layer_norm_backward: a row's sums in 32 lanes
//                                 (ops/shared/lane_sum.h, the order a GPU warp shares), which the compiler vectorizes.
//   BM_layer_norm_row_order_peer: the former CPU kernel: the same passes, threads and conversions, each row's sums one
//                                 running float32 sum in index order (the order that left a GPU row to one lane).
// Shapes: the transformer of `bench step` (batch 32 x 64 positions, width 128) and a wider model's (2048, 1024).
// Report ratios; an absolute time is only a note about this machine.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "mixtrain/core/random.h"
#include "mixtrain/ops/layer_norm.h"

namespace mixtrain {
namespace {

const DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
const int64_t kShapes[][2] = {{32 * 64, 128}, {2048, 1024}};
constexpr float kEpsilon = 1e-3f;
constexpr int64_t kRowsPerBlock = 64;  // the column sums' blocks, as in the kernel

Tensor uniform_tensor(const Shape& shape, uint64_t seed, DType dtype, float offset = 0.0f) {
  Rng r(seed);
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = offset + r.uniform(-1.0f, 1.0f);
  return t.to(dtype);
}

struct Inputs {
  Tensor x, dy, gamma, beta;
};
Inputs inputs(int64_t rows, int64_t d, DType dt) {
  return {uniform_tensor({rows, d}, 7, dt, 0.5f), uniform_tensor({rows, d}, 8, dt), uniform_tensor({d}, 9, DType::kFloat32),
          uniform_tensor({d}, 10, DType::kFloat32)};
}

void label(benchmark::State& state, int64_t rows, int64_t d, DType dt) {
  state.SetLabel(std::to_string(rows) + "x" + std::to_string(d) + " " + dtype_name(dt));
}

void BM_layer_norm(benchmark::State& state) {
  const int64_t rows = kShapes[state.range(0)][0], d = kShapes[state.range(0)][1];
  const DType dt = kDTypes[state.range(1)];
  const Inputs in = inputs(rows, d, dt);
  for (auto _ : state) {
    const ops::LayerNormOutput out = ops::layer_norm(in.x, in.gamma, in.beta, kEpsilon);
    const ops::LayerNormGrads g = ops::layer_norm_backward(in.dy, in.x, out.mean, out.rstd, in.gamma, true);
    benchmark::DoNotOptimize(out.y.raw());
    benchmark::DoNotOptimize(g.dx.raw());
  }
  label(state, rows, d, dt);
}

// Row r as float32 (in place for float32, else widened into buf), as the kernel reads it.
const float* read_row(const Tensor& t, int64_t r, int64_t d, float* buf) {
  const char* p = static_cast<const char*>(t.raw()) + static_cast<size_t>(r * d) * dtype_size(t.dtype());
  if (t.dtype() == DType::kFloat32) return reinterpret_cast<const float*>(p);
  convert_elements(p, t.dtype(), buf, DType::kFloat32, d);
  return buf;
}
void write_row(Tensor& t, int64_t r, int64_t d, const float* v) {
  convert_elements(v, DType::kFloat32, static_cast<char*>(t.raw()) + static_cast<size_t>(r * d) * dtype_size(t.dtype()),
                   t.dtype(), d);
}

void BM_layer_norm_row_order_peer(benchmark::State& state) {
  const int64_t rows = kShapes[state.range(0)][0], d = kShapes[state.range(0)][1];
  const DType dt = kDTypes[state.range(1)];
  const Inputs in = inputs(rows, d, dt);
  const float* gm = in.gamma.data<float>();
  const float* bt = in.beta.data<float>();
  const float inv_d = 1.0f / static_cast<float>(d);
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  for (auto _ : state) {
    Tensor y = Tensor::empty({rows, d}, dt), dx = Tensor::empty({rows, d}, dt);
    std::vector<float> mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
    std::vector<float> partial(static_cast<size_t>(blocks * 2 * d), 0.0f), dgamma(static_cast<size_t>(d), 0.0f),
        dbeta(static_cast<size_t>(d), 0.0f);
#pragma omp parallel if (rows * d > (int64_t{1} << 15))
    {
      std::vector<float> xb(static_cast<size_t>(d)), gb(static_cast<size_t>(d)), ob(static_cast<size_t>(d)),
          xhat(static_cast<size_t>(d)), g(static_cast<size_t>(d));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        const float* v = read_row(in.x, r, d, xb.data());
        float s = 0.0f;
        for (int64_t j = 0; j < d; ++j) s += v[j];
        const float mu = s * inv_d;
        float ss = 0.0f;
        for (int64_t j = 0; j < d; ++j) ss += (v[j] - mu) * (v[j] - mu);
        const float rs = 1.0f / std::sqrt(ss * inv_d + kEpsilon);
        mean[static_cast<size_t>(r)] = mu;
        rstd[static_cast<size_t>(r)] = rs;
        for (int64_t j = 0; j < d; ++j) ob[static_cast<size_t>(j)] = (v[j] - mu) * rs * gm[j] + bt[j];
        write_row(y, r, d, ob.data());
      }
#pragma omp for schedule(static)
      for (int64_t b = 0; b < blocks; ++b) {
        float* pg = partial.data() + b * 2 * d;
        float* pb = pg + d;
        for (int64_t r = b * kRowsPerBlock; r < std::min(rows, (b + 1) * kRowsPerBlock); ++r) {
          const float* v = read_row(in.x, r, d, xb.data());
          const float* dv = read_row(in.dy, r, d, gb.data());
          const float mu = mean[static_cast<size_t>(r)], rs = rstd[static_cast<size_t>(r)];
          float sg = 0.0f, sgx = 0.0f;
          for (int64_t j = 0; j < d; ++j) {
            const float xh = (v[j] - mu) * rs;
            xhat[static_cast<size_t>(j)] = xh;
            pg[j] += dv[j] * xh;
            pb[j] += dv[j];
            const float gj = dv[j] * gm[j];
            g[static_cast<size_t>(j)] = gj;
            sg += gj;
            sgx += gj * xh;
          }
          const float mg = sg * inv_d, mgx = sgx * inv_d;
          for (int64_t j = 0; j < d; ++j)
            ob[static_cast<size_t>(j)] =
                rs * (g[static_cast<size_t>(j)] - mg - xhat[static_cast<size_t>(j)] * mgx);
          write_row(dx, r, d, ob.data());
        }
      }
    }
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t j = 0; j < d; ++j) {
        dgamma[static_cast<size_t>(j)] += partial[static_cast<size_t>(b * 2 * d + j)];
        dbeta[static_cast<size_t>(j)] += partial[static_cast<size_t>(b * 2 * d + d + j)];
      }
    benchmark::DoNotOptimize(y.raw());
    benchmark::DoNotOptimize(dx.raw());
    benchmark::DoNotOptimize(dgamma.data());
  }
  label(state, rows, d, dt);
}

BENCHMARK(BM_layer_norm)->ArgsProduct({{0, 1}, {0, 1, 2}});
BENCHMARK(BM_layer_norm_row_order_peer)->ArgsProduct({{0, 1}, {0, 1, 2}});

}  // namespace
}  // namespace mixtrain

BENCHMARK_MAIN();
