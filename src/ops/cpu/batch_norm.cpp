// CPU backend of batch normalization. x is (rows, C). Rows are read as float32 in blocks (16-bit ones
// converted, vectorised); per-channel sums go through fixed blocks of rows whose partial sums are added in block
// order, so results do not depend on the thread count. The blocks and the element arithmetic are
// ops/shared/batch_norm_channel.h's, which the GPU kernel runs in the same order.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../shared/batch_norm_channel.h"
#include "mixtrain/ops/batch_norm.h"
#include "float_lanes.h"
#include "cpu_backend.h"

namespace mixtrain::ops::cpu {

namespace {

constexpr int64_t kRowsPerBlock = shared::kBatchNormRowsPerBlock;

struct Rows {
  const char* base;
  DType dtype;
  int64_t c;
  // Rows [r0, r0 + count) as float32: in place when already float32, else converted into scratch.
  const float* view(int64_t r0, int64_t count, float* scratch) const {
    const char* p = base + static_cast<size_t>(r0 * c) * dtype_size(dtype);
    if (dtype == DType::kFloat32) return reinterpret_cast<const float*>(p);
    convert_elements(p, dtype, scratch, DType::kFloat32, count * c);
    return scratch;
  }
};

// Rows per conversion step when x (and dy) share one dtype: about 2048 elements, so the float32 copies of a
// 16-bit block stay in L1 instead of a whole block's (256 rows) going through L2.
int64_t sub_rows(int64_t c) { return std::clamp<int64_t>(2048 / std::max<int64_t>(c, 1), 1, kRowsPerBlock); }

// One block of rows of channel_sums / map_rows with x, dy and y in dtype T, read and written in steps of
// sub_rows(c) rows. The bodies run over rows in order, so stepping leaves every sum's order unchanged.
template <typename T, typename Body>
MIXTRAIN_CPU_BODY void sums_block_body(const T* x, const T* dy, int64_t c, int64_t count, float* bx, float* bdy,
                                    float* sums, const Body& body) {
  const int64_t step = sub_rows(c);
  for (int64_t r = 0; r < count; r += step) {
    const int64_t k = std::min(step, count - r);
    body(lanes::read(x + r * c, k * c, bx), dy ? lanes::read(dy + r * c, k * c, bdy) : nullptr, k, sums);
  }
}
MIXTRAIN_CPU_VARIANTS(sums_block)

template <typename T, typename Fn>
MIXTRAIN_CPU_BODY void rows_block_body(const T* x, const T* dy, T* y, int64_t c, int64_t count, float* bx, float* bdy,
                                    float* by, const Fn& f) {
  const int64_t step = sub_rows(c);
  for (int64_t r = 0; r < count; r += step) {
    const int64_t k = std::min(step, count - r);
    float* o = lanes::out(y + r * c, by);
    f(lanes::read(x + r * c, k * c, bx), dy ? lanes::read(dy + r * c, k * c, bdy) : nullptr, k, o);
    lanes::write(o, k * c, y + r * c);
  }
}
MIXTRAIN_CPU_VARIANTS(rows_block)

// Per-channel sums: for each block of rows, body(block_x, block_dy, rows_in_block, sums) adds into
// `sums` (nsum arrays of C floats, laid out [s][c]); the blocks' partials are then added in order.
// dy may have a null base (only x is read).
template <typename Body>
std::vector<float> channel_sums(const Rows& x, const Rows& dy, int64_t rows, int nsum, Body&& body) {
  const int64_t c = x.c;
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  std::vector<float> partial(static_cast<size_t>(blocks * nsum * c), 0.0f);
  if (is_float(x.dtype) && (!dy.base || dy.dtype == x.dtype)) {
    dispatch_float(x.dtype, "batch_norm", [&](auto tag) {
      using T = decltype(tag);
      const T* xp = reinterpret_cast<const T*>(x.base);
      const T* dp = reinterpret_cast<const T*>(dy.base);
#pragma omp parallel if (rows * c > 32768)
      {
        std::vector<float> bx(static_cast<size_t>(sub_rows(c) * c)), bdy(bx.size());
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; ++b) {
          const int64_t r0 = b * kRowsPerBlock, count = std::min(kRowsPerBlock, rows - r0);
          sums_block(xp + r0 * c, dp ? dp + r0 * c : nullptr, c, count, bx.data(), bdy.data(),
                     partial.data() + b * nsum * c, body);
        }
      }
    });
  } else {
#pragma omp parallel if (rows * c > 32768)
  {
    std::vector<float> bx(x.dtype == DType::kFloat32 ? 0 : static_cast<size_t>(kRowsPerBlock * c));
    std::vector<float> bdy(dy.base && dy.dtype != DType::kFloat32 ? static_cast<size_t>(kRowsPerBlock * c) : 0);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t r0 = b * kRowsPerBlock, count = std::min(kRowsPerBlock, rows - r0);
      body(x.view(r0, count, bx.data()), dy.base ? dy.view(r0, count, bdy.data()) : nullptr, count,
           partial.data() + b * nsum * c);
    }
  }
  }
  std::vector<float> total(static_cast<size_t>(nsum * c), 0.0f);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t i = 0; i < nsum * c; ++i)
      total[static_cast<size_t>(i)] = shared::add_rn(total[static_cast<size_t>(i)], partial[static_cast<size_t>(b * nsum * c + i)]);
  return total;
}

std::vector<float> inv_std(const Tensor& variance, float epsilon) {
  const float* v = static_cast<const float*>(variance.raw());
  std::vector<float> out(static_cast<size_t>(variance.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = shared::batch_norm_inv_std(v[i], epsilon);
  return out;
}

// Applies f(x_block, dy_block, count, out_block) over blocks of rows, all float32, and stores out into y
// in y's dtype, rounded once (a float32 y is written directly). dy may have a null base.
template <typename Fn>
void map_rows(const Rows& x, const Rows& dy, int64_t rows, Tensor& y, Fn&& f) {
  const int64_t c = x.c;
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  char* yp = static_cast<char*>(y.raw());
  const DType yt = y.dtype();
  const size_t es = dtype_size(yt);
  if (is_float(yt) && x.dtype == yt && (!dy.base || dy.dtype == yt)) {
    dispatch_float(yt, "batch_norm", [&](auto tag) {
      using T = decltype(tag);
      const T* xp = reinterpret_cast<const T*>(x.base);
      const T* dp = reinterpret_cast<const T*>(dy.base);
      T* yp_t = reinterpret_cast<T*>(yp);
#pragma omp parallel if (rows * c > 32768)
      {
        std::vector<float> bx(static_cast<size_t>(sub_rows(c) * c)), bdy(bx.size()), by(bx.size());
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; ++b) {
          const int64_t r0 = b * kRowsPerBlock, count = std::min(kRowsPerBlock, rows - r0);
          rows_block(xp + r0 * c, dp ? dp + r0 * c : nullptr, yp_t + r0 * c, c, count, bx.data(), bdy.data(),
                     by.data(), f);
        }
      }
    });
    return;
  }
#pragma omp parallel if (rows * c > 32768)
  {
    std::vector<float> bx(x.dtype == DType::kFloat32 ? 0 : static_cast<size_t>(kRowsPerBlock * c));
    std::vector<float> bdy(dy.base && dy.dtype != DType::kFloat32 ? static_cast<size_t>(kRowsPerBlock * c) : 0);
    std::vector<float> out(yt == DType::kFloat32 ? 0 : static_cast<size_t>(kRowsPerBlock * c));
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t r0 = b * kRowsPerBlock, count = std::min(kRowsPerBlock, rows - r0);
      char* dst = yp + static_cast<size_t>(r0 * c) * es;
      float* o = yt == DType::kFloat32 ? reinterpret_cast<float*>(dst) : out.data();
      f(x.view(r0, count, bx.data()), dy.base ? dy.view(r0, count, bdy.data()) : nullptr, count, o);
      if (yt != DType::kFloat32) convert_elements(o, DType::kFloat32, dst, yt, count * c);
    }
  }
}

// Per-channel sums of x (center null) or of (x - center)^2: the moments' two passes before their 1 / rows.
std::vector<float> x_sums(const Tensor& x, const float* center) {
  const int64_t c = x.dim(-1), rows = x.numel() / c;
  const Rows xr{static_cast<const char*>(x.raw()), x.dtype(), c};
  const Rows none{nullptr, DType::kFloat32, c};
  if (!center)
    return channel_sums(xr, none, rows, 1, [c](const float* bx, const float*, int64_t count, float* out) {
      for (int64_t r = 0; r < count; ++r)
        for (int64_t j = 0; j < c; ++j) out[j] = shared::add_rn(out[j], bx[r * c + j]);
    });
  return channel_sums(xr, none, rows, 1, [c, center](const float* bx, const float*, int64_t count, float* out) {
    for (int64_t r = 0; r < count; ++r)
      for (int64_t j = 0; j < c; ++j)
        out[j] = shared::add_rn(out[j], shared::batch_norm_square_dev(bx[r * c + j], center[j]));
  });
}

// dx from dy, x, the statistics and the channel sums of dy and dy * xhat: divided by rows with batch statistics
// (training, the statistics being functions of x), else unused (inference: dx = gamma * inv_std * dy).
void write_dx(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& gamma, const float* inv_std,
              const float* sum_dy, const float* sum_dyx, bool batch_statistics, Tensor& dx) {
  const int64_t c = x.dim(-1), rows = x.numel() / c;
  const float* m = static_cast<const float*>(mean.raw());
  const float* gm = static_cast<const float*>(gamma.raw());
  std::vector<float> k(static_cast<size_t>(c)), mdy(static_cast<size_t>(c)), mdyx(static_cast<size_t>(c));
  for (int64_t j = 0; j < c; ++j) {
    const size_t i = static_cast<size_t>(j);
    k[i] = shared::mul_rn(gm[j], inv_std[j]);
    mdy[i] = shared::batch_norm_grad_mean(sum_dy[j], rows, batch_statistics);
    mdyx[i] = shared::batch_norm_grad_mean(sum_dyx[j], rows, batch_statistics);
  }
  const float *kp = k.data(), *a = mdy.data(), *b = mdyx.data();
  map_rows(Rows{static_cast<const char*>(x.raw()), x.dtype(), c}, Rows{static_cast<const char*>(dy.raw()), dy.dtype(), c},
           rows, dx, [&](const float* bx, const float* bdy, int64_t count, float* out) {
             for (int64_t r = 0; r < count; ++r)
               for (int64_t j = 0; j < c; ++j)
                 out[r * c + j] = shared::batch_norm_dx(bdy[r * c + j], bx[r * c + j], m[j], inv_std[j], kp[j], a[j], b[j]);
           });
}
}  // namespace

void batch_moments(const Tensor& x, Tensor& mean, Tensor& variance) {
  const int64_t c = x.dim(-1), rows = x.numel() / c;
  const float inv_rows = shared::batch_norm_inv_rows(rows);
  float* m = static_cast<float*>(mean.raw());
  float* v = static_cast<float*>(variance.raw());
  std::vector<float> s = x_sums(x, nullptr);
  for (int64_t j = 0; j < c; ++j) m[j] = shared::mul_rn(s[static_cast<size_t>(j)], inv_rows);
  // Second pass over the deviations: no cancellation between E[x^2] and E[x]^2.
  s = x_sums(x, m);
  for (int64_t j = 0; j < c; ++j) v[j] = shared::mul_rn(s[static_cast<size_t>(j)], inv_rows);
}

void batch_channel_sums(const Tensor& x, const Tensor& center, Tensor& sums) {
  const std::vector<float> s = x_sums(x, center.defined() ? static_cast<const float*>(center.raw()) : nullptr);
  std::copy(s.begin(), s.end(), static_cast<float*>(sums.raw()));
}

void batch_norm(const Tensor& x, const Tensor& mean, const Tensor& variance, const Tensor& gamma, const Tensor& beta,
                float epsilon, Tensor& y) {
  const int64_t c = x.dim(-1), rows = x.numel() / c;
  const float* m = static_cast<const float*>(mean.raw());
  const float* gm = static_cast<const float*>(gamma.raw());
  const float* bt = static_cast<const float*>(beta.raw());
  const float* var = static_cast<const float*>(variance.raw());
  std::vector<float> scale(static_cast<size_t>(c));  // gamma / sqrt(var + eps)
  for (int64_t j = 0; j < c; ++j) scale[static_cast<size_t>(j)] = shared::batch_norm_scale(var[j], epsilon, gm[j]);
  const float* sc = scale.data();
  map_rows(Rows{static_cast<const char*>(x.raw()), x.dtype(), c}, Rows{nullptr, DType::kFloat32, c}, rows, y,
           [&](const float* bx, const float*, int64_t count, float* out) {
             for (int64_t r = 0; r < count; ++r)
               for (int64_t j = 0; j < c; ++j) out[r * c + j] = shared::batch_norm_value(bx[r * c + j], m[j], sc[j], bt[j]);
           });
}

void batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& variance,
                         const Tensor& gamma, float epsilon, bool batch_statistics, Tensor& dx, Tensor& dgamma,
                         Tensor& dbeta) {
  const int64_t c = x.dim(-1), rows = x.numel() / c;
  const Rows xr{static_cast<const char*>(x.raw()), x.dtype(), c};
  const Rows dyr{static_cast<const char*>(dy.raw()), dy.dtype(), c};
  const float* m = static_cast<const float*>(mean.raw());
  const std::vector<float> istd = inv_std(variance, epsilon);
  const float* is = istd.data();
  // dbeta = sum(dy), dgamma = sum(dy * xhat) with xhat = (x - mean) * inv_std.
  const std::vector<float> s =
      channel_sums(xr, dyr, rows, 2, [c, m, is](const float* bx, const float* bdy, int64_t count, float* out) {
        for (int64_t r = 0; r < count; ++r)
          for (int64_t j = 0; j < c; ++j) {
            out[j] = shared::add_rn(out[j], bdy[r * c + j]);
            out[c + j] = shared::add_rn(out[c + j], shared::batch_norm_dgamma_term(bdy[r * c + j], bx[r * c + j], m[j], is[j]));
          }
      });
  float* db = static_cast<float*>(dbeta.raw());
  float* dg = static_cast<float*>(dgamma.raw());
  for (int64_t j = 0; j < c; ++j) {
    db[j] = s[static_cast<size_t>(j)];
    dg[j] = s[static_cast<size_t>(c + j)];
  }
  if (!dx.defined()) return;
  write_dx(dy, x, mean, gamma, is, db, dg, batch_statistics, dx);
}

void batch_norm_input_grad(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& variance,
                           const Tensor& gamma, float epsilon, const Tensor& sum_dy, const Tensor& sum_dy_xhat,
                           Tensor& dx) {
  const std::vector<float> istd = inv_std(variance, epsilon);
  write_dx(dy, x, mean, gamma, istd.data(), static_cast<const float*>(sum_dy.raw()),
           static_cast<const float*>(sum_dy_xhat.raw()), /*batch_statistics=*/true, dx);
}

void moving_statistics(const Tensor& moving_mean, const Tensor& moving_variance, const Tensor& mean,
                       const Tensor& variance, float momentum, Tensor& next_mean, Tensor& next_variance,
                       Tensor& skipped) {
  const int64_t c = mean.numel();
  const float *mm = moving_mean.data<float>(), *mv = moving_variance.data<float>();
  const float *bm = mean.data<float>(), *bv = variance.data<float>();
  float *nm = next_mean.data<float>(), *nv = next_variance.data<float>();
  bool finite = true;
  for (int64_t j = 0; j < c; ++j) finite = finite && shared::float_is_finite(bm[j]) && shared::float_is_finite(bv[j]);
  const float one_minus = shared::sub_rn(1.0f, momentum);
  for (int64_t j = 0; j < c; ++j) {
    nm[j] = finite ? shared::moving_average(mm[j], bm[j], momentum, one_minus) : mm[j];
    nv[j] = finite ? shared::moving_average(mv[j], bv[j], momentum, one_minus) : mv[j];
  }
  if (!finite) skipped.data<float>()[0] += 1.0f;
}

void register_batch_norm_kernels(Kernels& k) {
  k.set<Op::batch_moments>(&batch_moments);
  k.set<Op::moving_statistics>(&moving_statistics);
  k.set<Op::batch_norm>(&batch_norm);
  k.set<Op::batch_norm_backward>(&batch_norm_backward);
  k.set<Op::batch_channel_sums>(&batch_channel_sums);
  k.set<Op::batch_norm_input_grad>(&batch_norm_input_grad);
}

}  // namespace mixtrain::ops::cpu
