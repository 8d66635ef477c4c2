// The CNN ops' arithmetic that the CUDA kernels share with the CPU (src/ops/shared/pool_window.h,
// batch_norm_channel.h, conv_patches.h), checked on the host against the CPU kernels bit for bit: each shared
// function is run in the GPU kernel's plan (one output or input element at a time, per-channel sums through the
// same blocks) and compared with the CPU op, in float32, float16 and bfloat16, at every instruction-set level the
// machine has (the CPU kernels' vectorised variants must agree with the element-wise form), NaN payloads aside where
// a sum holds two NaNs. Runs everywhere, with or without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "mixtrain/core/isa_level.h"
#include "mixtrain/kernels/gemm.h"
#include "mixtrain/ops/batch_norm.h"
#include "mixtrain/ops/conv2d.h"
#include "mixtrain/ops/pooling.h"
#include "op_test_util.h"
#include "ops/shared/batch_norm_channel.h"
#include "ops/shared/conv_patches.h"
#include "ops/shared/float16_convert.h"
#include "ops/shared/ordered_sum.h"
#include "ops/shared/pool_window.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::random_tensor;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Bit for bit, except that any NaN matches any NaN: a sum holding two NaNs keeps one operand's payload, and which
// one the compiler leaves first differs even between the CPU kernel's own instruction-set variants.
bool same_values(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape()) return false;
  const std::vector<float> gv = got.to_floats(), wv = want.to_floats();
  for (size_t i = 0; i < gv.size(); ++i) {
    if (std::isnan(gv[i]) && std::isnan(wv[i])) continue;
    if (std::memcmp(&gv[i], &wv[i], sizeof(float)) != 0) return false;  // float32 holds every 16-bit value exactly
  }
  return true;
}

shared::FloatView view(const Tensor& t) { return {t.raw(), shared::float_code(t.dtype()), 0}; }

struct ResetIsa {
  ~ResetIsa() { set_isa_level_for_testing(std::nullopt); }
};

// The levels to compare at: those of the CPU kernels' variants (baseline and AVX2) the machine supports.
std::vector<IsaLevel> isa_levels() {
  std::vector<IsaLevel> out;
  for (IsaLevel level : {IsaLevel::kScalar, IsaLevel::kAvx2}) {
    if (set_isa_level_for_testing(level) == level)
      out.push_back(level);
    else
      std::printf("[ note ] %s not supported here, not compared\n", isa_level_name(level));
  }
  set_isa_level_for_testing(std::nullopt);
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Pooling

struct PoolCase {
  Shape x;
  Size2 pool, strides;
  Padding padding;
};
// Windows cut by the edge ("same"), overlapping windows (stride < pool), gaps between windows (stride > pool: some
// inputs get no gradient), a window as large as the image, a 1x1 image, uneven heights and widths.
const PoolCase kPoolCases[] = {
    {{2, 7, 5, 3}, 2, 2, Padding::kValid},         {{2, 7, 5, 3}, 2, 2, Padding::kSame},
    {{1, 9, 7, 17}, 3, 2, Padding::kSame},         {{3, 8, 9, 1}, {3, 2}, {1, 2}, Padding::kValid},
    {{2, 5, 6, 4}, 3, 1, Padding::kSame},          {{1, 4, 4, 2}, 4, 4, Padding::kValid},
    {{2, 9, 8, 5}, 2, 3, Padding::kValid},         {{1, 1, 1, 7}, 3, 2, Padding::kSame},
    {{2, 6, 11, 33}, {2, 3}, {2, 2}, Padding::kSame},
};

// Values with ties (several positions holding a window's maximum), signed zeros, infinities, NaN (one window whose
// values are all NaN or -inf when the image is large enough) and numbers past float16's range.
Tensor pool_input(const Shape& shape, uint64_t seed, DType dt, bool specials) {
  std::vector<float> v = random_tensor(shape, seed, DType::kFloat32, -4.0f, 4.0f).to_floats();
  for (size_t i = 0; i < v.size(); ++i) {
    if (i % 7 == 3) v[i] = std::round(v[i]);  // ties
  }
  if (specials) {
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const float special[] = {nan, -inf, inf, -0.0f, 0.0f, 70000.0f, -nan, 1e-41f};
    for (size_t i = 0; i < std::size(special); ++i) v[(i * 37 + 5) % v.size()] = special[i];
    if (v.size() > 64) {
      // The first pixel's channel 0 and its neighbours: NaN or -inf only, so a window may hold no number.
      const int64_t c = shape[3], w = shape[2];
      v[0] = nan;
      v[static_cast<size_t>(c)] = -inf;
      v[static_cast<size_t>(w * c)] = -inf;
      v[static_cast<size_t>((w + 1) * c)] = nan;
    }
  }
  return Tensor::from_floats(shape, v, dt);
}

Tensor pool_by_shared(const Tensor& x, bool is_max, const Window2d& g) {
  Tensor y = Tensor::empty({g.batch, g.h.out, g.w.out, g.channels}, x.dtype());
  const shared::FloatView xv = view(x);
  int64_t i = 0;
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t oh = 0; oh < g.h.out; ++oh)
      for (int64_t ow = 0; ow < g.w.out; ++ow)
        for (int64_t ch = 0; ch < g.channels; ++ch, ++i)
          shared::store_from_float(y.raw(), shared::float_code(x.dtype()), i,
                                   shared::pool_window_value(xv, is_max, g, n, oh, ow, ch));
  return y;
}

Tensor pool_backward_by_shared(const Tensor& dy, const Tensor& x, bool is_max, const Window2d& g, DType x_dtype) {
  std::vector<int64_t> argmax(static_cast<size_t>(dy.numel()));
  if (is_max) {
    const shared::FloatView xv = view(x);
    size_t i = 0;
    for (int64_t n = 0; n < g.batch; ++n)
      for (int64_t oh = 0; oh < g.h.out; ++oh)
        for (int64_t ow = 0; ow < g.w.out; ++ow)
          for (int64_t ch = 0; ch < g.channels; ++ch) argmax[i++] = shared::max_pool_argmax(xv, g, n, oh, ow, ch);
  }
  Tensor dx = Tensor::empty({g.batch, g.h.in, g.w.in, g.channels}, x_dtype);
  const shared::FloatView dv = view(dy);
  const int64_t* am = argmax.data();
  int64_t i = 0;
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t ih = 0; ih < g.h.in; ++ih)
      for (int64_t iw = 0; iw < g.w.in; ++iw)
        for (int64_t ch = 0; ch < g.channels; ++ch, ++i)
          shared::store_from_float(dx.raw(), shared::float_code(x_dtype), i,
                                   shared::pool_input_grad(dv, am, is_max, g, n, ih, iw, ch));
  return dx;
}

TEST(CudaSharedMath, CoveringWindowsAreThoseWhoseSpanHoldsThePosition) {
  for (int64_t in : {1, 2, 5, 9}) {
    for (int64_t window : {1, 2, 3, 4}) {
      for (int64_t stride : {1, 2, 3, 5}) {
        for (Padding p : {Padding::kValid, Padding::kSame}) {
          const Axis a = window_axis(in, window, stride, p, "test");
          for (int64_t i = 0; i < in; ++i) {
            const shared::IndexRange r = shared::covering_windows(a, i);
            for (int64_t o = 0; o < a.out; ++o) {
              const shared::IndexRange s = shared::window_span(a, o);
              EXPECT_EQ(o >= r.begin && o < r.end, i >= s.begin && i < s.end)
                  << "in=" << in << " window=" << window << " stride=" << stride << " " << padding_name(p)
                  << " i=" << i << " o=" << o;
            }
          }
        }
      }
    }
  }
}

TEST(CudaSharedMath, PoolingWindowsGiveTheCpuKernelsBits) {
  ResetIsa reset;
  for (IsaLevel level : isa_levels()) {
    set_isa_level_for_testing(level);
    for (DType dt : kFloatDTypes) {
      for (const PoolCase& pc : kPoolCases) {
        const Pool2dOptions o{pc.pool, pc.strides, pc.padding};
        const Window2d g = window_2d(pc.x, pc.pool, pc.strides, pc.padding, "test");
        for (bool specials : {false, true}) {
          const Tensor x = pool_input(pc.x, 11 + static_cast<uint64_t>(pc.x.numel()), dt, specials);
          const std::string what = std::string(isa_level_name(level)) + " " + dtype_name(dt) + " " +
                                   pc.x.to_string() + " " + padding_name(pc.padding) +
                                   (specials ? " with NaN and infinities" : "");
          EXPECT_TRUE(same_bits(pool_by_shared(x, true, g), max_pool2d(x, o))) << "max " << what;
          EXPECT_TRUE(same_values(pool_by_shared(x, false, g), avg_pool2d(x, o))) << "avg " << what;
          for (DType dy_dt : {dt, DType::kFloat32}) {
            const Tensor dy = random_tensor({g.batch, g.h.out, g.w.out, g.channels}, 13, dy_dt);
            EXPECT_TRUE(same_bits(pool_backward_by_shared(dy, x, true, g, dt), max_pool2d_backward(dy, x, o)))
                << "max backward dy " << dtype_name(dy_dt) << " " << what;
            EXPECT_TRUE(same_bits(pool_backward_by_shared(dy, x, false, g, dt), avg_pool2d_backward(dy, pc.x, dt, o)))
                << "avg backward dy " << dtype_name(dy_dt) << " " << what;
          }
        }
      }
    }
  }
}

TEST(CudaSharedMath, GlobalAveragePoolingGivesTheCpuKernelsBits) {
  for (DType dt : kFloatDTypes) {
    for (const Shape& shape : {Shape({1, 1, 1, 1}), Shape({2, 3, 5, 7}), Shape({3, 9, 11, 17}), Shape({2, 0, 4, 3})}) {
      const Tensor x = pool_input(shape, 17, dt, shape.numel() > 0);
      const int64_t n_img = shape[0], pixels = shape[1] * shape[2], c = shape[3];
      Tensor want_y = Tensor::empty({n_img, c}, dt);
      for (int64_t i = 0; i < n_img * c; ++i)
        shared::store_from_float(want_y.raw(), shared::float_code(dt), i,
                                 shared::global_average_value(view(x), pixels, c, i / c, i % c));
      const std::string what = std::string(dtype_name(dt)) + " " + shape.to_string();
      EXPECT_TRUE(same_values(want_y, global_average_pool2d(x))) << what;
      for (DType dy_dt : {dt, DType::kFloat32}) {
        const Tensor dy = random_tensor({n_img, c}, 19, dy_dt);
        Tensor want_dx = Tensor::empty(shape, dt);
        const float inv = shared::global_average_factor(pixels);
        for (int64_t i = 0; i < shape.numel(); ++i)
          shared::store_from_float(want_dx.raw(), shared::float_code(dt), i,
                                   shared::mul_rn(view(dy)[(i / (pixels * c)) * c + i % c], inv));
        EXPECT_TRUE(same_bits(want_dx, global_average_pool2d_backward(dy, shape, dt))) << what << " backward";
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Batch normalization

// Channel sums by the GPU kernel's plan: block b's partial sum of term(r, j) over its rows, then the blocks' sums
// in block order.
template <typename Term>
std::vector<float> channel_sums_by_shared(int64_t rows, int64_t c, const Term& term) {
  const int64_t blocks = (rows + shared::kBatchNormRowsPerBlock - 1) / shared::kBatchNormRowsPerBlock;
  std::vector<float> partial(static_cast<size_t>(blocks * c)), total(static_cast<size_t>(c));
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t j = 0; j < c; ++j) {
      const int64_t r0 = b * shared::kBatchNormRowsPerBlock;
      const int64_t r1 = std::min(rows, r0 + shared::kBatchNormRowsPerBlock);
      partial[static_cast<size_t>(b * c + j)] = shared::batch_norm_block_sum(r0, r1, [&](int64_t r) { return term(r, j); });
    }
  for (int64_t j = 0; j < c; ++j)
    total[static_cast<size_t>(j)] =
        shared::ordered_sum(blocks, [&](int64_t b) { return partial[static_cast<size_t>(b * c + j)]; });
  return total;
}

Tensor floats(const std::vector<float>& v) { return Tensor::from_floats({static_cast<int64_t>(v.size())}, v); }

TEST(CudaSharedMath, BatchNormGivesTheCpuKernelsBits) {
  constexpr float kEps = 1e-3f;
  ResetIsa reset;
  for (IsaLevel level : isa_levels()) {
    set_isa_level_for_testing(level);
    for (DType dt : kFloatDTypes) {
      // 257 and 600 rows: two and three blocks of the channel sums, the last one short. An (N, H, W, C) batch too.
      for (const Shape& shape : {Shape({1, 1}), Shape({7, 3}), Shape({256, 17}), Shape({257, 5}), Shape({600, 64}),
                                 Shape({3, 5, 7, 31})}) {
        const int64_t c = shape[-1], rows = shape.numel() / c;
        // Terms of mixed magnitudes around an offset, so that another summation order would show in the bits.
        std::vector<float> xv = random_tensor(shape, 23 + static_cast<uint64_t>(shape.numel()), DType::kFloat32).to_floats();
        for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::ldexp(xv[i], static_cast<int>(i * 7 % 23) - 11) + 100.0f;
        const Tensor x = Tensor::from_floats(shape, xv, dt);
        const shared::FloatView xr = view(x);
        const Tensor gamma = random_tensor({c}, 29, DType::kFloat32, 0.5f, 1.5f);
        const Tensor beta = random_tensor({c}, 31, DType::kFloat32);
        const std::string what = std::string(isa_level_name(level)) + " " + dtype_name(dt) + " " + shape.to_string();

        // Moments: the two passes.
        const float inv_rows = shared::batch_norm_inv_rows(rows);
        std::vector<float> mean = channel_sums_by_shared(rows, c, [&](int64_t r, int64_t j) { return xr[r * c + j]; });
        for (float& m : mean) m = shared::mul_rn(m, inv_rows);
        std::vector<float> var = channel_sums_by_shared(
            rows, c, [&](int64_t r, int64_t j) { return shared::batch_norm_square_dev(xr[r * c + j], mean[static_cast<size_t>(j)]); });
        for (float& v : var) v = shared::mul_rn(v, inv_rows);
        const BatchNormStats st = batch_moments(x);
        EXPECT_TRUE(same_bits(floats(mean), st.mean)) << "mean " << what;
        EXPECT_TRUE(same_bits(floats(var), st.variance)) << "variance " << what;

        // Forward with the batch's statistics and with others (inference: moving statistics).
        const Tensor moving_mean = random_tensor({c}, 37, DType::kFloat32, 99.0f, 101.0f);
        const Tensor moving_var = random_tensor({c}, 41, DType::kFloat32, 0.0f, 2.0f);
        for (bool training : {true, false}) {
          const Tensor m = training ? st.mean : moving_mean, v = training ? st.variance : moving_var;
          Tensor want = Tensor::empty(shape, dt);
          for (int64_t i = 0; i < shape.numel(); ++i) {
            const int64_t j = i % c;
            const float scale = shared::batch_norm_scale(v.data<float>()[j], kEps, gamma.data<float>()[j]);
            shared::store_from_float(want.raw(), shared::float_code(dt), i,
                                     shared::batch_norm_value(xr[i], m.data<float>()[j], scale, beta.data<float>()[j]));
          }
          EXPECT_TRUE(same_bits(want, batch_norm(x, m, v, gamma, beta, kEps))) << "forward " << what;

          // Backward, with dy in x's dtype and in float32, through the statistics (training) or not.
          for (DType dy_dt : {dt, DType::kFloat32}) {
            const Tensor dy = random_tensor(shape, 43, dy_dt);
            const shared::FloatView dv = view(dy);
            const float* mp = m.data<float>();
            const float* vp = v.data<float>();
            const std::vector<float> dbeta = channel_sums_by_shared(rows, c, [&](int64_t r, int64_t j) { return dv[r * c + j]; });
            const std::vector<float> dgamma = channel_sums_by_shared(rows, c, [&](int64_t r, int64_t j) {
              return shared::batch_norm_dgamma_term(dv[r * c + j], xr[r * c + j], mp[j], shared::batch_norm_inv_std(vp[j], kEps));
            });
            Tensor want_dx = Tensor::empty(shape, dt);
            for (int64_t i = 0; i < shape.numel(); ++i) {
              const int64_t j = i % c;
              const float is = shared::batch_norm_inv_std(vp[j], kEps);
              const float k = shared::mul_rn(gamma.data<float>()[j], is);
              const size_t js = static_cast<size_t>(j);
              shared::store_from_float(
                  want_dx.raw(), shared::float_code(dt), i,
                  shared::batch_norm_dx(dv[i], xr[i], mp[j], is, k, shared::batch_norm_grad_mean(dbeta[js], rows, training),
                                        shared::batch_norm_grad_mean(dgamma[js], rows, training)));
            }
            for (bool need_x : {true, false}) {
              const std::string which = what + " dy " + dtype_name(dy_dt) + (training ? " training" : " inference") +
                                        (need_x ? "" : " without dx");
              const BatchNormGrads got = batch_norm_backward(dy, x, m, v, gamma, kEps, training, need_x);
              EXPECT_TRUE(same_bits(floats(dbeta), got.dbeta)) << "dbeta " << which;
              EXPECT_TRUE(same_bits(floats(dgamma), got.dgamma)) << "dgamma " << which;
              if (need_x) {
                EXPECT_TRUE(same_bits(want_dx, got.dx)) << "dx " << which;
              }
            }
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// conv2d: the shared unfolding, folding and dbias blocks, with the CPU's own GEMM between them, give the CPU op's
// bits (the batches are small enough for the CPU kernel's one chunk, so both run the same GEMM calls).

struct ConvCase {
  Shape x;
  Size2 kernel, strides;
  Padding padding;
  int64_t cout;
};
const ConvCase kConvCases[] = {
    {{2, 7, 5, 3}, 3, 1, Padding::kSame, 4},        {{2, 7, 5, 3}, 3, 2, Padding::kValid, 5},
    {{1, 9, 8, 2}, {3, 2}, {2, 3}, Padding::kSame, 7}, {{3, 6, 6, 4}, 1, 1, Padding::kValid, 3},  // x is col
    {{2, 5, 5, 3}, 1, 2, Padding::kSame, 2},         {{1, 4, 6, 1}, 5, 1, Padding::kSame, 17},
    {{2, 8, 7, 5}, 2, 3, Padding::kValid, 6},        {{1, 1, 1, 3}, 3, 1, Padding::kSame, 2},
};

TEST(CudaSharedMath, ConvPatchesGiveTheCpuKernelsBits) {
  ResetIsa reset;
  for (IsaLevel level : isa_levels()) {
    set_isa_level_for_testing(level);
    for (DType dt : kFloatDTypes) {
      for (const ConvCase& cc : kConvCases) {
        const int64_t cin = cc.x[3];
        const Shape kshape{cc.kernel.h, cc.kernel.w, cin, cc.cout};
        const Window2d g = window_2d(cc.x, cc.kernel, cc.strides, cc.padding, "test");
        const Tensor x = random_tensor(cc.x, 47 + static_cast<uint64_t>(cc.x.numel()), dt);
        const Tensor kernel = random_tensor(kshape, 53, dt);
        const Tensor bias = random_tensor({cc.cout}, 59, DType::kFloat32);
        const int64_t k = kshape.numel() / cc.cout, rows = g.batch * g.h.out * g.w.out;
        const size_t es = dtype_size(dt);
        const std::string what = std::string(isa_level_name(level)) + " " + dtype_name(dt) + " " + cc.x.to_string() +
                                 " kernel " + kshape.to_string() + " " + padding_name(cc.padding);
        // col by im2col_source: bit copies of x's taps, zeros in the padding.
        Tensor col = Tensor::empty({rows, k}, dt);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t kk = 0; kk < k; ++kk) {
            const int64_t src = shared::im2col_source(g, 0, r, kk);
            char* dst = static_cast<char*>(col.raw()) + static_cast<size_t>(r * k + kk) * es;
            if (src < 0)
              std::memset(dst, 0, es);
            else
              std::memcpy(dst, static_cast<const char*>(x.raw()) + static_cast<size_t>(src) * es, es);
          }
        const Conv2dOptions o{cc.strides, cc.padding};
        Tensor want_y = Tensor::empty({g.batch, g.h.out, g.w.out, cc.cout}, dt);
        kernels::gemm(false, false, rows, cc.cout, k, dt, col.raw(), k, kernel.raw(), cc.cout, dt, want_y.raw(),
                      cc.cout, false, bias.data<float>());
        EXPECT_TRUE(same_bits(want_y, conv2d(x, kernel, bias, o))) << "forward " << what;

        const Tensor dy = random_tensor(want_y.shape(), 61, dt);
        const Conv2dGrads got = conv2d_backward(dy, x, kernel, o, true, true);
        // dkernel: col^T x dy in float32.
        Tensor want_dk = Tensor::zeros(kshape, DType::kFloat32);
        kernels::gemm(true, false, k, cc.cout, rows, dt, col.raw(), k, dy.raw(), cc.cout, DType::kFloat32,
                      want_dk.raw(), cc.cout, true, nullptr);
        EXPECT_TRUE(same_bits(want_dk, got.dkernel)) << "dkernel " << what;
        // dx: dcol = dy x kernel^T in float32 (the identity case's dx is that product, rounded once), then folded.
        Tensor dcol = Tensor::empty({rows, k}, DType::kFloat32);
        kernels::gemm(false, true, rows, k, cc.cout, dt, dy.raw(), cc.cout, kernel.raw(), cc.cout, DType::kFloat32,
                      dcol.raw(), k, false, nullptr);
        Tensor want_dx = Tensor::empty(cc.x, dt);
        const float* dc = dcol.data<float>();
        int64_t i = 0;
        for (int64_t n = 0; n < g.batch; ++n)
          for (int64_t ih = 0; ih < g.h.in; ++ih)
            for (int64_t iw = 0; iw < g.w.in; ++iw)
              for (int64_t ch = 0; ch < cin; ++ch, ++i)
                shared::store_from_float(want_dx.raw(), shared::float_code(dt), i,
                                         shared::col2im_value(dc, g, n, ih, iw, ch));
        EXPECT_TRUE(same_bits(want_dx, got.dx)) << "dx " << what;
        // dbias: dy's column sums through the shared blocks.
        const int64_t blocks = (rows + shared::kConvBiasRowsPerBlock - 1) / shared::kConvBiasRowsPerBlock;
        std::vector<float> partial(static_cast<size_t>(blocks * cc.cout)), dbias(static_cast<size_t>(cc.cout));
        for (int64_t b = 0; b < blocks; ++b)
          for (int64_t j = 0; j < cc.cout; ++j)
            partial[static_cast<size_t>(b * cc.cout + j)] = shared::row_block_sum(
                rows, b, [&](int64_t r) { return view(dy)[r * cc.cout + j]; }, shared::kConvBiasRowsPerBlock);
        for (int64_t j = 0; j < cc.cout; ++j)
          dbias[static_cast<size_t>(j)] =
              shared::ordered_sum(blocks, [&](int64_t b) { return partial[static_cast<size_t>(b * cc.cout + j)]; });
        EXPECT_TRUE(same_bits(floats(dbias), got.dbias)) << "dbias " << what;
      }
    }
  }
}

// dbias's blocks with more rows than one block, summands of mixed magnitudes: another order would show in the bits.
TEST(CudaSharedMath, ConvBiasGradientAddsInTheCpuKernelsBlocks) {
  for (DType dt : kFloatDTypes) {
    const Shape xs{5, 21, 20, 1};  // 5 * 21 * 20 = 2100 output rows: three blocks, the last one short
    const Tensor x = random_tensor(xs, 67, dt);
    const Tensor kernel = random_tensor({1, 1, 1, 3}, 71, dt);
    std::vector<float> dv = random_tensor({5, 21, 20, 3}, 73, DType::kFloat32).to_floats();
    for (size_t i = 0; i < dv.size(); ++i) dv[i] = std::ldexp(dv[i], static_cast<int>(i * 5 % 19) - 9);
    const Tensor dy = Tensor::from_floats({5, 21, 20, 3}, dv, dt);
    const int64_t rows = 2100, cols = 3;
    const int64_t blocks = (rows + shared::kConvBiasRowsPerBlock - 1) / shared::kConvBiasRowsPerBlock;
    std::vector<float> want(static_cast<size_t>(cols));
    for (int64_t j = 0; j < cols; ++j)
      want[static_cast<size_t>(j)] = shared::ordered_sum(blocks, [&](int64_t b) {
        return shared::row_block_sum(
            rows, b, [&](int64_t r) { return view(dy)[r * cols + j]; }, shared::kConvBiasRowsPerBlock);
      });
    EXPECT_TRUE(same_bits(floats(want), conv2d_backward(dy, x, kernel, Conv2dOptions{}, false, true).dbias))
        << dtype_name(dt);
  }
}

}  // namespace
}  // namespace mixtrain::ops
