// The tiled GEMM behind gemm_fallback.h. Each 16 x 16 block computes a 16 x 16 tile of C, one element per thread:
// the block stages a 16-term slice of A's rows and B's columns in shared memory (each thread loading one element
// of each, converted to float32), then every thread adds its slice's terms in order (ops/shared/gemm_element.h).
// The last slice's staged zeros past k are skipped. Tiles and products beyond the grid's limits are looped, so any
// m, n and count are served.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "../shared/float16_convert.h"
#include "../shared/gemm_element.h"
#include "backend.h"
#include "device_util.cuh"
#include "gemm_fallback.h"

namespace mixtrain::ops::cuda {

namespace {

constexpr int kTile = 16;
constexpr int64_t kMaxGridY = 65535, kMaxGridZ = 65535, kMaxGridX = int64_t{1} << 30;

struct FallbackArgs {
  const void* a;
  const void* b;
  int ab_code;
  int64_t a_stride, b_stride, count;
  int64_t m, n, k, lda, ldb;
  bool trans_a, trans_b;
  void* d;
  int d_code;
  float alpha;
  const float* bias;
};

__global__ void gemm_fallback_kernel(FallbackArgs g) {
  __shared__ float as[kTile][kTile + 1];  // as[r][c] = op(A)[row0 + r][t0 + c]; the + 1 keeps banks apart
  __shared__ float bs[kTile][kTile + 1];  // bs[r][c] = op(B)[t0 + r][col0 + c]
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int64_t tiles_m = (g.m + kTile - 1) / kTile, tiles_n = (g.n + kTile - 1) / kTile;
  // Every thread of the block runs the same loops (their bounds depend on the block only), so the syncs are met.
  for (int64_t p = blockIdx.z; p < g.count; p += gridDim.z) {
    const int64_t a0 = p * g.a_stride, b0 = p * g.b_stride;
    for (int64_t tm = blockIdx.y; tm < tiles_m; tm += gridDim.y) {
      for (int64_t tn = blockIdx.x; tn < tiles_n; tn += gridDim.x) {
        const int64_t i = tm * kTile + ty, j = tn * kTile + tx;
        float acc = 0.0f;
        for (int64_t t0 = 0; t0 < g.k; t0 += kTile) {
          const int64_t at = t0 + tx, bt = t0 + ty;
          as[ty][tx] = i < g.m && at < g.k
                           ? shared::load_as_float(g.a, g.ab_code, a0 + shared::gemm_a_offset(g.trans_a, g.lda, i, at))
                           : 0.0f;
          bs[ty][tx] = bt < g.k && j < g.n
                           ? shared::load_as_float(g.b, g.ab_code, b0 + shared::gemm_b_offset(g.trans_b, g.ldb, bt, j))
                           : 0.0f;
          __syncthreads();
          const int terms = g.k - t0 < kTile ? static_cast<int>(g.k - t0) : kTile;
          for (int c = 0; c < terms; ++c) acc = shared::gemm_accumulate(acc, as[ty][c], bs[c][tx]);
          __syncthreads();
        }
        if (i < g.m && j < g.n)
          shared::store_from_float(g.d, g.d_code, p * g.m * g.n + i * g.n + j, shared::gemm_finish(acc, g.alpha, g.bias, j));
      }
    }
  }
}

std::atomic<int64_t> fallback_products{0};
std::atomic<bool> fallback_only{false};

unsigned grid_extent(int64_t want, int64_t cap) { return static_cast<unsigned>(want < cap ? want : cap); }

}  // namespace

void gemm_fallback(const GemmProblem& p) {
  const kernel::BmmLayout& l = *p.l;
  if (p.count == 0 || l.m == 0 || l.n == 0) return;
  const FallbackArgs g{p.a,  p.b,          shared::float_code(p.ab_dtype), p.a_stride, p.b_stride, p.count,
                       l.m,  l.n,          l.k,                            l.lda,      l.ldb,      l.trans_a,
                       l.trans_b, p.d,     shared::float_code(p.d_dtype),  p.alpha,    p.bias};
  const dim3 grid(grid_extent((l.n + kTile - 1) / kTile, kMaxGridX), grid_extent((l.m + kTile - 1) / kTile, kMaxGridY),
                  grid_extent(p.count, kMaxGridZ));
  gemm_fallback_kernel<<<grid, dim3(kTile, kTile)>>>(g);
  device::launched("gemm_fallback");
  fallback_products.fetch_add(p.count, std::memory_order_relaxed);
}

int64_t gemm_fallback_products() { return fallback_products.load(std::memory_order_relaxed); }

void set_gemm_fallback_only(bool on) { fallback_only.store(on, std::memory_order_relaxed); }
bool gemm_fallback_only() { return fallback_only.load(std::memory_order_relaxed); }

}  // namespace mixtrain::ops::cuda
