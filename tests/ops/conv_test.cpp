// conv2d forward and backward against a float64 reference, in every floating dtype, on odd shapes,
// strides and both paddings; also a batch large enough to be computed in several chunks.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "mixtrain/core/random.h"
#include "mixtrain/kernels/gemm.h"
#include "mixtrain/ops/conv2d.h"

#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::random_tensor;
using testing::unit;

// A sum of `terms` float32 products whose magnitudes add to `abs_sum`, rounded once into dtype d, lies
// within (terms + 2) 2^-24 abs_sum (the classic bound for recursive float32 summation, with slack for
// blocked orders) plus 2 units of d of the exact value.
// The GEMM's opt-in "fp16" method for float16 (kernels/gemm.h) keeps short partial sums in float16:
// its documented bound is 4x that of float32 accumulation, taken here as 4 float16 units of abs_sum.
double tolerance(DType d, double exact, double abs_sum, int64_t terms) {
  const double sums = d == DType::kFloat16 && std::string(kernels::gemm_f16_method()) == "fp16"
                          ? 4 * unit(d) * abs_sum
                          : static_cast<double>(terms + 2) * 0x1p-24 * abs_sum;
  return 2 * unit(d) * std::fabs(exact) + sums + 1e-30;
}

struct Case {
  Shape x;       // (N, H, W, cin)
  Size2 kernel;  // (kh, kw)
  int64_t cout;
  Size2 strides;
  Padding padding;
};

// Float64 conv of float inputs (already rounded to their dtype), forward and backward by definition.
struct Reference {
  std::vector<double> y, y_abs;                    // (N, OH, OW, cout), and sums of |products|
  std::vector<double> dx, dx_abs, dw, dw_abs, db;  // gradients for a given dy, and sums of |products|
  Window2d g;
};

Reference reference(const Case& c, const std::vector<float>& x, const std::vector<float>& w,
                    const std::vector<float>& b, const std::vector<float>& dy) {
  Reference r;
  r.g = window_2d(c.x, c.kernel, c.strides, c.padding, "reference");
  const Window2d& g = r.g;
  const int64_t n_ = g.batch, h = g.h.in, wd = g.w.in, ci = g.channels, oh_n = g.h.out, ow_n = g.w.out;
  const int64_t kh = c.kernel.h, kw = c.kernel.w, co = c.cout;
  r.y.assign(static_cast<size_t>(n_ * oh_n * ow_n * co), 0.0);
  r.y_abs = r.y;
  r.dx.assign(x.size(), 0.0);
  r.dx_abs = r.dx;
  r.dw.assign(w.size(), 0.0);
  r.dw_abs = r.dw;
  r.db.assign(static_cast<size_t>(co), 0.0);
  for (int64_t n = 0; n < n_; ++n)
    for (int64_t oh = 0; oh < oh_n; ++oh)
      for (int64_t ow = 0; ow < ow_n; ++ow)
        for (int64_t o = 0; o < co; ++o) {
          const size_t yi = static_cast<size_t>(((n * oh_n + oh) * ow_n + ow) * co + o);
          double s = b.empty() ? 0.0 : b[static_cast<size_t>(o)];
          double sa = std::fabs(s);
          const double d = dy.empty() ? 0.0 : dy[yi];
          r.db[static_cast<size_t>(o)] += d;
          for (int64_t ki = 0; ki < kh; ++ki)
            for (int64_t kj = 0; kj < kw; ++kj) {
              const int64_t ih = oh * g.h.stride - g.h.pad_before + ki, iw = ow * g.w.stride - g.w.pad_before + kj;
              if (ih < 0 || ih >= h || iw < 0 || iw >= wd) continue;
              for (int64_t i = 0; i < ci; ++i) {
                const size_t xi = static_cast<size_t>(((n * h + ih) * wd + iw) * ci + i);
                const size_t wi = static_cast<size_t>(((ki * kw + kj) * ci + i) * co + o);
                s += static_cast<double>(x[xi]) * w[wi];
                sa += std::fabs(static_cast<double>(x[xi]) * w[wi]);
                r.dx[xi] += d * w[wi];
                r.dx_abs[xi] += std::fabs(d * w[wi]);
                r.dw[wi] += d * x[xi];
                r.dw_abs[wi] += std::fabs(d * x[xi]);
              }
            }
          r.y[yi] = s;
          r.y_abs[yi] = sa;
        }
  return r;
}

void check_case(const Case& c, DType d, bool with_bias) {
  const Shape ks{c.kernel.h, c.kernel.w, c.x[3], c.cout};
  Tensor x = random_tensor(c.x, 1, d), w = random_tensor(ks, 2, d, -0.5f, 0.5f);
  Tensor b = with_bias ? random_tensor({c.cout}, 3, DType::kFloat32) : Tensor();
  const Conv2dOptions o{c.strides, c.padding};
  Tensor y = conv2d(x, w, b, o);
  ASSERT_EQ(y.shape(), conv2d_output_shape(c.x, ks, o));
  ASSERT_EQ(y.dtype(), d);
  Tensor dy = random_tensor(y.shape(), 4, d);
  const Reference r = reference(c, x.to_floats(), w.to_floats(), with_bias ? b.to_floats() : std::vector<float>{},
                                dy.to_floats());
  const std::string what = std::string(dtype_name(d)) + " x " + c.x.to_string() + " kernel " +
                           std::to_string(c.kernel.h) + "x" + std::to_string(c.kernel.w) + " strides " +
                           std::to_string(c.strides.h) + "," + std::to_string(c.strides.w) + " " +
                           padding_name(c.padding);
  const std::vector<float> yv = y.to_floats();
  const int64_t k = c.kernel.h * c.kernel.w * c.x[3];
  for (size_t i = 0; i < yv.size(); ++i)
    ASSERT_NEAR(yv[i], r.y[i], tolerance(d, r.y[i], r.y_abs[i], k)) << what << " y[" << i << "]";

  const Conv2dGrads gr = conv2d_backward(dy, x, w, o, true, with_bias);
  ASSERT_EQ(gr.dx.dtype(), d);
  ASSERT_EQ(gr.dkernel.dtype(), DType::kFloat32);
  const std::vector<float> dx = gr.dx.to_floats(), dw = gr.dkernel.to_floats();
  // dx sums at most kh * kw * cout products, dkernel N * OH * OW; the kernel's gradient is float32.
  for (size_t i = 0; i < dx.size(); ++i)
    ASSERT_NEAR(dx[i], r.dx[i], tolerance(d, r.dx[i], r.dx_abs[i], c.kernel.h * c.kernel.w * c.cout))
        << what << " dx[" << i << "]";
  const int64_t rows = y.numel() / c.cout;
  for (size_t i = 0; i < dw.size(); ++i)
    ASSERT_NEAR(dw[i], r.dw[i], tolerance(DType::kFloat32, r.dw[i], r.dw_abs[i], rows)) << what << " dw[" << i << "]";
  if (with_bias) {
    ASSERT_EQ(gr.dbias.dtype(), DType::kFloat32);
    const std::vector<float> db = gr.dbias.to_floats();
    for (size_t i = 0; i < db.size(); ++i)
      ASSERT_NEAR(db[i], r.db[i], (rows + 2) * 0x1p-24 * rows + 1e-6) << what << " db[" << i << "]";
  }
}

TEST(Conv2d, MatchesFloat64OnOddShapesInEveryDType) {
  const Case cases[] = {
      {{2, 7, 5, 3}, {3, 3}, 5, 1, Padding::kValid},
      {{2, 7, 5, 3}, {3, 3}, 5, 1, Padding::kSame},
      {{1, 9, 7, 1}, {3, 2}, 17, {2, 1}, Padding::kSame},
      {{3, 8, 9, 2}, {2, 3}, 7, 2, Padding::kValid},
      {{2, 5, 5, 7}, {1, 1}, 3, 1, Padding::kValid},  // no unfolding: x is the patch matrix
      {{2, 6, 5, 4}, {1, 1}, 3, 2, Padding::kSame},
      {{1, 4, 4, 3}, {5, 5}, 2, 1, Padding::kSame},   // kernel larger than the image
      {{2, 11, 13, 5}, {3, 3}, 31, 3, Padding::kSame},
  };
  for (DType d : kFloatDTypes)
    for (const Case& c : cases) {
      check_case(c, d, true);
      if (HasFatalFailure()) return;
    }
  check_case(cases[1], DType::kFloat32, false);
}

// y_dtype / dx_dtype float32 from 16-bit inputs: the float32 sums themselves, which rounded into the input's dtype give
// the plain call's bits (one GEMM, one sum order, only the final rounding differs), and alpha (dx_alpha) scales those
// sums before the bias and the rounding; the kernel's gradient is the same. The 1x1 case multiplies x directly, the
// others go through the patches and col2im. A float16 output from bfloat16 inputs is refused.
TEST(Conv2d, Float32OutputsOfA16BitConvolutionAreItsUnroundedSums) {
  const Case cases[] = {{{2, 7, 5, 3}, {3, 3}, 5, 1, Padding::kSame},
                        {{3, 8, 9, 2}, {2, 3}, 7, 2, Padding::kValid},
                        {{2, 5, 5, 7}, {1, 1}, 3, 1, Padding::kValid}};
  for (DType d : {DType::kBFloat16, DType::kFloat16})
    for (const Case& c : cases) {
      const Tensor x = random_tensor(c.x, 1, d), w = random_tensor({c.kernel.h, c.kernel.w, c.x[3], c.cout}, 2, d);
      const Tensor b = random_tensor({c.cout}, 3, DType::kFloat32);
      const Conv2dOptions o{c.strides, c.padding};
      const Tensor y = conv2d(x, w, b, o), y32 = conv2d(x, w, b, o, DType::kFloat32);
      ASSERT_EQ(y32.dtype(), DType::kFloat32);
      EXPECT_EQ(testing::bits_of(y32.to(d)), testing::bits_of(y)) << dtype_name(d) << " " << c.x.to_string();
      // alpha: the sums times alpha, then plus the bias, each rounded to float32, then one rounding into d.
      const float alpha = 1.0f / 3000.0f;
      const std::vector<float> sums = conv2d(x, w, Tensor(), o, DType::kFloat32).to_floats(), bv = b.to_floats();
      std::vector<float> want(sums.size());
      for (size_t i = 0; i < sums.size(); ++i) {
        volatile float scaled = alpha * sums[i];  // volatile: rounded before the bias is added
        want[i] = scaled + bv[i % bv.size()];
      }
      EXPECT_EQ(testing::bits_of(conv2d(x, w, b, o, std::nullopt, alpha)),
                testing::bits_of(Tensor::from_floats(y.shape(), want, d)))
          << dtype_name(d) << " " << c.x.to_string();
      const Tensor dy = random_tensor(y.shape(), 4, d);
      const Conv2dGrads g = conv2d_backward(dy, x, w, o, true, false);
      const Conv2dGrads g32 = conv2d_backward(dy, x, w, o, true, false, DType::kFloat32);
      ASSERT_EQ(g32.dx.dtype(), DType::kFloat32);
      EXPECT_EQ(testing::bits_of(g32.dx.to(d)), testing::bits_of(g.dx)) << dtype_name(d) << " " << c.x.to_string();
      EXPECT_EQ(testing::bits_of(g32.dkernel), testing::bits_of(g.dkernel));
      const std::vector<float> dx_sums = g32.dx.to_floats();
      std::vector<float> dx_want(dx_sums.size());
      for (size_t i = 0; i < dx_sums.size(); ++i) dx_want[i] = alpha * dx_sums[i];
      EXPECT_EQ(testing::bits_of(conv2d_backward(dy, x, w, o, true, false, std::nullopt, alpha).dx),
                testing::bits_of(Tensor::from_floats(x.shape(), dx_want, d)))
          << dtype_name(d) << " " << c.x.to_string();
    }
  const Tensor x = random_tensor({1, 4, 4, 2}, 1, DType::kBFloat16);
  const Tensor w = random_tensor({3, 3, 2, 2}, 2, DType::kBFloat16);
  EXPECT_THROW(conv2d(x, w, Tensor(), {}, DType::kFloat16), Error);
  EXPECT_THROW(conv2d_backward(conv2d(x, w, Tensor(), {}), x, w, {}, true, false, DType::kFloat16), Error);
}

TEST(Conv2d, LargeBatchIsComputedInChunks) {
  // 9 images of 64x64x16 with a 3x3 kernel: 590k patch elements per image, so a chunk of 2M elements
  // holds 3 images and both passes run over 3 chunks.
  check_case({{9, 64, 64, 16}, {3, 3}, 8, 1, Padding::kSame}, DType::kFloat32, true);
  check_case({{9, 64, 64, 16}, {3, 3}, 8, 1, Padding::kSame}, DType::kBFloat16, true);
}

TEST(Conv2d, GeometryFollowsTensorFlow) {
  // same: ceil(in / stride), padding split with the extra one after.
  Axis a = window_axis(28, 3, 1, Padding::kSame, "t");
  EXPECT_EQ(a.out, 28);
  EXPECT_EQ(a.pad_before, 1);
  a = window_axis(28, 2, 2, Padding::kSame, "t");
  EXPECT_EQ(a.out, 14);
  EXPECT_EQ(a.pad_before, 0);
  a = window_axis(7, 4, 2, Padding::kSame, "t");  // out 4, pad_total 3, before 1
  EXPECT_EQ(a.out, 4);
  EXPECT_EQ(a.pad_before, 1);
  a = window_axis(7, 3, 2, Padding::kValid, "t");
  EXPECT_EQ(a.out, 3);
  EXPECT_EQ(a.pad_before, 0);
}

// An empty batch (a data-parallel rank's share of a small batch, or an empty validation split): an empty output and
// zero kernel and bias gradients, no error.
TEST(Conv2d, AnEmptyBatchGivesAnEmptyOutputAndZeroGradients) {
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    const Tensor x = Tensor::zeros({0, 5, 5, 3}, dt), kernel = Tensor::full({3, 3, 3, 4}, dt, 1.0f);
    const Conv2dOptions o{1, Padding::kValid};
    const Tensor y = conv2d(x, kernel, Tensor::full({4}, DType::kFloat32, 1.0f), o);
    EXPECT_EQ(y.shape(), Shape({0, 3, 3, 4}));
    EXPECT_EQ(y.dtype(), dt);
    const Conv2dGrads g = conv2d_backward(Tensor::zeros({0, 3, 3, 4}, dt), x, kernel, o, true, true);
    EXPECT_EQ(g.dx.shape(), x.shape());
    EXPECT_EQ(g.dkernel.to_floats(), std::vector<float>(3 * 3 * 3 * 4, 0.0f));
    EXPECT_EQ(g.dbias.to_floats(), std::vector<float>(4, 0.0f));
  }
}

TEST(Conv2d, BadArgumentsThrowWithShapes) {
  Tensor x = Tensor::zeros({1, 5, 5, 3}, DType::kFloat32);
  EXPECT_THROW(conv2d(x, Tensor::zeros({3, 3, 2, 4}, DType::kFloat32), Tensor(), {}), Error);  // channels
  EXPECT_THROW(conv2d(x, Tensor::zeros({3, 3, 3, 4}, DType::kFloat16), Tensor(), {}), Error);  // dtypes
  EXPECT_THROW(conv2d(x, Tensor::zeros({7, 7, 3, 4}, DType::kFloat32), Tensor(), {}), Error);  // does not fit
  EXPECT_THROW(conv2d(x, Tensor::zeros({3, 3, 3, 4}, DType::kFloat32), Tensor::zeros({3}, DType::kFloat32), {}),
               Error);  // bias length
  EXPECT_THROW(conv2d(Tensor::zeros({5, 5, 3}, DType::kFloat32), Tensor::zeros({3, 3, 3, 4}, DType::kFloat32),
                      Tensor(), {}),
               Error);  // rank
  EXPECT_THROW(parse_padding("SAME"), Error);
  try {
    conv2d(x, Tensor::zeros({3, 3, 2, 4}, DType::kFloat32), Tensor(), {});
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(1, 5, 5, 3)"), std::string::npos) << e.what();
  }
}

TEST(Conv2d, StridedViewInputIsMadeContiguous) {
  Tensor x = random_tensor({2, 6, 6, 3}, 7, DType::kFloat32);
  Tensor w = random_tensor({3, 3, 3, 2}, 8, DType::kFloat32);
  Tensor view = x.permute({0, 2, 1, 3});  // (N, W, H, C) view, not contiguous
  ASSERT_FALSE(view.is_contiguous());
  const std::vector<float> a = conv2d(view, w, Tensor(), {}).to_floats();
  const std::vector<float> b = conv2d(view.contiguous(), w, Tensor(), {}).to_floats();
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace mixtrain::ops
