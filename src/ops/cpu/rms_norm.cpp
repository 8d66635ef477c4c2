// CPU kernels of RMS normalization. x is (rows, D). Each row is read as float32 (in place for float32, widened into
// a row buffer for 16-bit data), normalized in float32 and rounded once. Rows run in parallel; a row's sums run in
// 32 lanes (shared/lane_sum.h); the backward's column sums (dscale) go through fixed blocks of rows whose partial
// sums are added in block order, so no result depends on the thread count. The arithmetic and its order are the
// shared functions of ops/shared/rms_norm_row.h, which the CUDA kernels run too.
#include <algorithm>
#include <vector>

#include "../shared/rms_norm_row.h"
#include "cpu_backend.h"
#include "float_rows.h"
#include "mixtrain/ops/rms_norm.h"

namespace mixtrain::ops::cpu {

namespace {

constexpr int64_t kRowsPerBlock = shared::kLayerNormRowsPerBlock;
constexpr int64_t kParallelMin = int64_t{1} << 15;  // elements; below this a thread team costs more than it saves

using float_rows::read_row;
using float_rows::row_out;
using float_rows::store_row;

}  // namespace

void rms_norm(const Tensor& x, const Tensor& scale, float epsilon, Tensor& y, Tensor& rstd) {
  const int64_t d = x.dim(-1), rows = x.numel() / d;
  const float* sc = scale.data<float>();
  float* rp = rstd.data<float>();
  const float inv_d = shared::layer_norm_inv_d(d);
#pragma omp parallel if (rows * d > kParallelMin)
  {
    std::vector<float> in(static_cast<size_t>(d)), out(static_cast<size_t>(d));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* v = read_row(x, r, d, in.data());
      const float rs = shared::rms_norm_row_rstd(v, d, inv_d, epsilon);
      rp[r] = rs;
      float* o = row_out(y, r, d, out.data());
      for (int64_t j = 0; j < d; ++j) o[j] = shared::rms_norm_value(v[j], rs, sc[j]);
      store_row(y, r, d, o);
    }
  }
}

void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& rstd, const Tensor& scale, Tensor& dx,
                       Tensor& dscale) {
  const int64_t d = x.dim(-1), rows = x.numel() / d;
  const float* sc = scale.data<float>();
  const float* rp = rstd.data<float>();
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  std::vector<float> partial(static_cast<size_t>(blocks * d), 0.0f);  // partial[b * d + j]: block b's dscale_j
  const bool need_x = dx.defined();
  const float inv_d = shared::layer_norm_inv_d(d);
#pragma omp parallel if (rows * d > kParallelMin)
  {
    std::vector<float> xb(static_cast<size_t>(d)), gb(static_cast<size_t>(d)), ob(static_cast<size_t>(d));
    std::vector<float> xhat(static_cast<size_t>(d)), g(static_cast<size_t>(d));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      float* ps = partial.data() + b * d;
      for (int64_t r = b * kRowsPerBlock; r < std::min(rows, (b + 1) * kRowsPerBlock); ++r) {
        const float* v = read_row(x, r, d, xb.data());
        const float* dv = read_row(dy, r, d, gb.data());
        const float rs = rp[r];
        float* xh = xhat.data();
        float* gr = g.data();
        for (int64_t j = 0; j < d; ++j) {
          xh[j] = shared::rms_norm_xhat(v[j], rs);
          ps[j] = shared::add_rn(ps[j], shared::mul_rn(dv[j], xh[j]));
          gr[j] = shared::layer_norm_g(dv[j], sc[j]);
        }
        if (!need_x) continue;
        const float sum_gx = shared::lane_sum(d, [gr, xh](int64_t j) { return shared::layer_norm_gx(gr[j], xh[j]); });
        const float mean_gx = shared::mul_rn(sum_gx, inv_d);
        float* o = row_out(dx, r, d, ob.data());
        for (int64_t j = 0; j < d; ++j) o[j] = shared::rms_norm_dx(gr[j], xh[j], rs, mean_gx);
        store_row(dx, r, d, o);
      }
    }
  }
  float* ds = dscale.data<float>();
  std::fill(ds, ds + d, 0.0f);
  for (int64_t b = 0; b < blocks; ++b)  // from +0, in block order
    for (int64_t j = 0; j < d; ++j) ds[j] = shared::add_rn(ds[j], partial[static_cast<size_t>(b * d + j)]);
}

void register_rms_norm_kernels(Kernels& k) {
  k.set<Op::rms_norm>(&rms_norm);
  k.set<Op::rms_norm_backward>(&rms_norm_backward);
}

}  // namespace mixtrain::ops::cpu
