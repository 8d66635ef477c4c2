// CPU kernels of layer normalization. x is (rows, D). Each row is read as float32 (in place for float32,
// widened into a row buffer for 16-bit data), normalized in float32 and rounded once. Rows run in parallel;
// the backward's column sums (dgamma, dbeta) go through fixed blocks of rows whose partial sums are added
// in block order, so no result depends on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "mixtrain/ops/layer_norm.h"

namespace mixtrain::ops::cpu {

namespace {

constexpr int64_t kRowsPerBlock = 64;
constexpr int64_t kParallelMin = int64_t{1} << 15;  // elements; below this a thread team costs more than it saves

// Row r of a (rows, d) tensor as float32: in place for float32, else widened into buf.
const float* read_row(const Tensor& t, int64_t r, int64_t d, float* buf) {
  const char* p = static_cast<const char*>(t.raw()) + static_cast<size_t>(r * d) * dtype_size(t.dtype());
  if (t.dtype() == DType::kFloat32) return reinterpret_cast<const float*>(p);
  convert_elements(p, t.dtype(), buf, DType::kFloat32, d);
  return buf;
}

// Where to compute row r of out: in place for float32, else buf (then store_row rounds it once).
float* row_out(Tensor& t, int64_t r, int64_t d, float* buf) {
  if (t.dtype() != DType::kFloat32) return buf;
  return static_cast<float*>(t.raw()) + r * d;
}
void store_row(Tensor& t, int64_t r, int64_t d, const float* v) {
  if (t.dtype() == DType::kFloat32) return;
  convert_elements(v, DType::kFloat32, static_cast<char*>(t.raw()) + static_cast<size_t>(r * d) * dtype_size(t.dtype()),
                   t.dtype(), d);
}

}  // namespace

void layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float epsilon, Tensor& y, Tensor& mean,
                Tensor& rstd) {
  const int64_t d = x.dim(-1), rows = x.numel() / d;
  const float* gm = gamma.data<float>();
  const float* bt = beta.data<float>();
  float* mp = mean.data<float>();
  float* rp = rstd.data<float>();
  const float inv_d = 1.0f / static_cast<float>(d);
#pragma omp parallel if (rows * d > kParallelMin)
  {
    std::vector<float> in(static_cast<size_t>(d)), out(static_cast<size_t>(d));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* v = read_row(x, r, d, in.data());
      float s = 0.0f;
      for (int64_t j = 0; j < d; ++j) s += v[j];
      const float mu = s * inv_d;
      // Second pass over the deviations: no cancellation between E[x^2] and E[x]^2.
      float ss = 0.0f;
      for (int64_t j = 0; j < d; ++j) {
        const float t = v[j] - mu;
        ss += t * t;
      }
      const float rs = 1.0f / std::sqrt(ss * inv_d + epsilon);
      mp[r] = mu;
      rp[r] = rs;
      float* o = row_out(y, r, d, out.data());
      for (int64_t j = 0; j < d; ++j) o[j] = (v[j] - mu) * rs * gm[j] + bt[j];
      store_row(y, r, d, o);
    }
  }
}

void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                         const Tensor& gamma, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const int64_t d = x.dim(-1), rows = x.numel() / d;
  const float* gm = gamma.data<float>();
  const float* mp = mean.data<float>();
  const float* rp = rstd.data<float>();
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  // partial[b] holds block b's dgamma (first d floats) and dbeta (next d).
  std::vector<float> partial(static_cast<size_t>(blocks * 2 * d), 0.0f);
  const bool need_x = dx.defined();
  const float inv_d = 1.0f / static_cast<float>(d);
#pragma omp parallel if (rows * d > kParallelMin)
  {
    std::vector<float> xb(static_cast<size_t>(d)), gb(static_cast<size_t>(d)), ob(static_cast<size_t>(d));
    std::vector<float> xhat(static_cast<size_t>(d)), g(static_cast<size_t>(d));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      float* pg = partial.data() + b * 2 * d;
      float* pb = pg + d;
      for (int64_t r = b * kRowsPerBlock; r < std::min(rows, (b + 1) * kRowsPerBlock); ++r) {
        const float* v = read_row(x, r, d, xb.data());
        const float* dv = read_row(dy, r, d, gb.data());
        const float mu = mp[r], rs = rp[r];
        float sum_g = 0.0f, sum_gx = 0.0f;
        for (int64_t j = 0; j < d; ++j) {
          const float xh = (v[j] - mu) * rs;
          xhat[static_cast<size_t>(j)] = xh;
          pg[j] += dv[j] * xh;
          pb[j] += dv[j];
          const float gj = dv[j] * gm[j];
          g[static_cast<size_t>(j)] = gj;
          sum_g += gj;
          sum_gx += gj * xh;
        }
        if (!need_x) continue;
        const float mean_g = sum_g * inv_d, mean_gx = sum_gx * inv_d;
        float* o = row_out(dx, r, d, ob.data());
        for (int64_t j = 0; j < d; ++j)
          o[j] = rs * (g[static_cast<size_t>(j)] - mean_g - xhat[static_cast<size_t>(j)] * mean_gx);
        store_row(dx, r, d, o);
      }
    }
  }
  float* dg = dgamma.data<float>();
  float* db = dbeta.data<float>();
  std::fill(dg, dg + d, 0.0f);
  std::fill(db, db + d, 0.0f);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* pg = partial.data() + b * 2 * d;
    for (int64_t j = 0; j < d; ++j) {
      dg[j] += pg[j];
      db[j] += pg[d + j];
    }
  }
}

}  // namespace mixtrain::ops::cpu
