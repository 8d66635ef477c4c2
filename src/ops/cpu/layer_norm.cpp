// CPU kernels of layer normalization. x is (rows, D). Each row is read as float32 (in place for float32,
// widened into a row buffer for 16-bit data), normalized in float32 and rounded once. Rows run in parallel;
// a row's sums run in 32 lanes (shared/lane_sum.h), which vectorize; the backward's column sums (dgamma, dbeta)
// go through fixed blocks of rows whose partial sums are added in block order, so no result depends on the thread
// count. The arithmetic and its order are the shared functions of ops/shared/layer_norm_row.h, which the CUDA
// kernels run too.
#include <algorithm>
#include <vector>

#include "../shared/layer_norm_row.h"
#include "mixtrain/ops/layer_norm.h"
#include "cpu_backend.h"
#include "float_rows.h"

namespace mixtrain::ops::cpu {

namespace {

constexpr int64_t kRowsPerBlock = shared::kLayerNormRowsPerBlock;
constexpr int64_t kParallelMin = int64_t{1} << 15;  // elements; below this a thread team costs more than it saves

using float_rows::read_row;
using float_rows::row_out;
using float_rows::store_row;

}  // namespace

void layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float epsilon, Tensor& y, Tensor& mean,
                Tensor& rstd) {
  const int64_t d = x.dim(-1), rows = x.numel() / d;
  const float* gm = gamma.data<float>();
  const float* bt = beta.data<float>();
  float* mp = mean.data<float>();
  float* rp = rstd.data<float>();
  const float inv_d = shared::layer_norm_inv_d(d);
#pragma omp parallel if (rows * d > kParallelMin)
  {
    std::vector<float> in(static_cast<size_t>(d)), out(static_cast<size_t>(d));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* v = read_row(x, r, d, in.data());
      const shared::LayerNormStats st = shared::layer_norm_row_stats(v, d, inv_d, epsilon);
      mp[r] = st.mean;
      rp[r] = st.rstd;
      float* o = row_out(y, r, d, out.data());
      for (int64_t j = 0; j < d; ++j) o[j] = shared::layer_norm_value(v[j], st.mean, st.rstd, gm[j], bt[j]);
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
  const float inv_d = shared::layer_norm_inv_d(d);
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
        // One pass for xhat, g and the block's column sums; the row's sums of g and g * xhat then run over the
        // saved terms in the lanes' order, as the GPU's warp adds them.
        float* xh = xhat.data();
        float* gr = g.data();
        for (int64_t j = 0; j < d; ++j) {
          xh[j] = shared::layer_norm_xhat(v[j], mu, rs);
          shared::layer_norm_column_step(pg[j], pb[j], dv[j], xh[j]);
          gr[j] = shared::layer_norm_g(dv[j], gm[j]);
        }
        if (!need_x) continue;
        const float sum_g = shared::lane_sum(d, [gr](int64_t j) { return gr[j]; });
        const float sum_gx = shared::lane_sum(d, [gr, xh](int64_t j) { return shared::layer_norm_gx(gr[j], xh[j]); });
        const float mean_g = shared::mul_rn(sum_g, inv_d), mean_gx = shared::mul_rn(sum_gx, inv_d);
        float* o = row_out(dx, r, d, ob.data());
        for (int64_t j = 0; j < d; ++j)
          o[j] = shared::layer_norm_dx(gr[j], xh[j], rs, mean_g, mean_gx);
        store_row(dx, r, d, o);
      }
    }
  }
  float* dg = dgamma.data<float>();
  float* db = dbeta.data<float>();
  std::fill(dg, dg + d, 0.0f);
  std::fill(db, db + d, 0.0f);
  for (int64_t b = 0; b < blocks; ++b) {  // from +0, in block order
    const float* pg = partial.data() + b * 2 * d;
    for (int64_t j = 0; j < d; ++j) {
      dg[j] = shared::add_rn(dg[j], pg[j]);
      db[j] = shared::add_rn(db[j], pg[d + j]);
    }
  }
}

void register_layer_norm_kernels(Kernels& k) {
  k.set<Op::layer_norm>(&layer_norm);
  k.set<Op::layer_norm_backward>(&layer_norm_backward);
}

}  // namespace mixtrain::ops::cpu
