// Pooling forward and backward against float64 references, in every floating dtype, on odd shapes,
// strides and both paddings.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "mixtrain/core/random.h"
#include "mixtrain/ops/pooling.h"

#include "op_test_util.h"

namespace mixtrain::ops {
namespace {

using testing::kFloatDTypes;
using testing::random_tensor;
using testing::unit;

struct Case {
  Shape x;
  Size2 pool, strides;
  Padding padding;
};
const Case kCases[] = {
    {{2, 7, 5, 3}, 2, 2, Padding::kValid},  {{2, 7, 5, 3}, 2, 2, Padding::kSame},
    {{1, 9, 7, 17}, 3, 2, Padding::kSame},  {{3, 8, 9, 1}, {3, 2}, {1, 2}, Padding::kValid},
    {{2, 5, 6, 4}, 3, 1, Padding::kSame},   {{1, 4, 4, 2}, 4, 4, Padding::kValid},
};

// Float64 pooling by definition; for each output also the position (flat index) of its first maximum.
struct Reference {
  std::vector<double> max, avg;
  std::vector<int64_t> argmax;
  std::vector<int64_t> count;
};

Reference reference(const Case& c, const std::vector<float>& x) {
  const Window2d g = window_2d(c.x, c.pool, c.strides, c.padding, "reference");
  Reference r;
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t oh = 0; oh < g.h.out; ++oh)
      for (int64_t ow = 0; ow < g.w.out; ++ow)
        for (int64_t ch = 0; ch < g.channels; ++ch) {
          double mx = -std::numeric_limits<double>::infinity(), s = 0;
          int64_t arg = -1, cnt = 0;
          for (int64_t ki = 0; ki < g.h.window; ++ki)
            for (int64_t kj = 0; kj < g.w.window; ++kj) {
              const int64_t ih = oh * g.h.stride - g.h.pad_before + ki, iw = ow * g.w.stride - g.w.pad_before + kj;
              if (ih < 0 || ih >= g.h.in || iw < 0 || iw >= g.w.in) continue;
              const int64_t i = ((n * g.h.in + ih) * g.w.in + iw) * g.channels + ch;
              const double v = x[static_cast<size_t>(i)];
              if (v > mx) {
                mx = v;
                arg = i;
              }
              s += v;
              ++cnt;
            }
          r.max.push_back(mx);
          r.avg.push_back(s / static_cast<double>(cnt));
          r.argmax.push_back(arg);
          r.count.push_back(cnt);
        }
  return r;
}

TEST(Pool2d, MaxAndAverageMatchFloat64InEveryDType) {
  for (DType d : kFloatDTypes)
    for (const Case& c : kCases) {
      const Pool2dOptions o{c.pool, c.strides, c.padding};
      Tensor x = random_tensor(c.x, 1, d);
      const Reference r = reference(c, x.to_floats());
      Tensor mx = max_pool2d(x, o), av = avg_pool2d(x, o);
      ASSERT_EQ(mx.shape(), pool2d_output_shape(c.x, o));
      ASSERT_EQ(mx.dtype(), d);
      ASSERT_EQ(av.dtype(), d);
      const std::vector<float> m = mx.to_floats(), a = av.to_floats();
      const std::string what = std::string(dtype_name(d)) + " " + c.x.to_string() + " " + padding_name(c.padding);
      for (size_t i = 0; i < m.size(); ++i) {
        ASSERT_EQ(m[i], r.max[i]) << what << ": a maximum is one of the inputs, exactly";
        // An average of at most 16 values in [-1, 1] summed in float32 (16 * 2^-24), rounded once.
        ASSERT_NEAR(a[i], r.avg[i], 2 * unit(d) * std::fabs(r.avg[i]) + 18 * 0x1p-24) << what << " avg " << i;
      }

      // Backward: the max gradient goes to the first maximum; the average's is shared among the window.
      Tensor dy = random_tensor(mx.shape(), 2, d);
      const std::vector<float> g = dy.to_floats();
      std::vector<double> dmax(static_cast<size_t>(x.numel()), 0.0), davg(static_cast<size_t>(x.numel()), 0.0);
      const Window2d geo = window_2d(c.x, c.pool, c.strides, c.padding, "reference");
      size_t oi = 0;
      for (int64_t n = 0; n < geo.batch; ++n)
        for (int64_t oh = 0; oh < geo.h.out; ++oh)
          for (int64_t ow = 0; ow < geo.w.out; ++ow)
            for (int64_t ch = 0; ch < geo.channels; ++ch, ++oi) {
              dmax[static_cast<size_t>(r.argmax[oi])] += g[oi];
              for (int64_t ki = 0; ki < geo.h.window; ++ki)
                for (int64_t kj = 0; kj < geo.w.window; ++kj) {
                  const int64_t ih = oh * geo.h.stride - geo.h.pad_before + ki,
                                iw = ow * geo.w.stride - geo.w.pad_before + kj;
                  if (ih < 0 || ih >= geo.h.in || iw < 0 || iw >= geo.w.in) continue;
                  davg[static_cast<size_t>(((n * geo.h.in + ih) * geo.w.in + iw) * geo.channels + ch)] +=
                      g[oi] / static_cast<double>(r.count[oi]);
                }
            }
      const std::vector<float> gm = max_pool2d_backward(dy, x, o).to_floats();
      const std::vector<float> ga = avg_pool2d_backward(dy, x.shape(), d, o).to_floats();
      for (size_t i = 0; i < gm.size(); ++i) {
        // At most 9 overlapping windows add into one element in float32, then one rounding.
        ASSERT_NEAR(gm[i], dmax[i], 2 * unit(d) * std::fabs(dmax[i]) + 12 * 0x1p-24 * 9) << what << " dmax " << i;
        ASSERT_NEAR(ga[i], davg[i], 2 * unit(d) * std::fabs(davg[i]) + 12 * 0x1p-24 * 9) << what << " davg " << i;
      }
    }
}

TEST(Pool2d, MaxPropagatesNaNAndIgnoresPadding) {
  // All-negative input with "same" padding: padded zeros must never win.
  Tensor x = Tensor::full({1, 3, 3, 1}, DType::kFloat16, -2.0f);
  const std::vector<float> y = max_pool2d(x, {2, 2, Padding::kSame}).to_floats();
  for (float v : y) EXPECT_EQ(v, -2.0f);
  Tensor z = Tensor::from_floats({1, 2, 2, 1}, {1.0f, NAN, 3.0f, 2.0f});
  EXPECT_TRUE(std::isnan(max_pool2d(z, {2, 2, Padding::kValid}).item()));
}

TEST(Pool2d, AverageSamePaddingCountsOnlyTheImage) {
  Tensor x = Tensor::full({1, 3, 3, 1}, DType::kFloat32, 1.0f);
  for (float v : avg_pool2d(x, {2, 2, Padding::kSame}).to_floats()) EXPECT_EQ(v, 1.0f);
}

TEST(GlobalAveragePool2d, MatchesFloat64InEveryDType) {
  for (DType d : kFloatDTypes)
    for (const Shape& s : {Shape{2, 7, 5, 3}, Shape{3, 1, 1, 17}, Shape{1, 13, 11, 31}}) {
      Tensor x = random_tensor(s, 3, d);
      const std::vector<float> xv = x.to_floats();
      Tensor y = global_average_pool2d(x);
      ASSERT_EQ(y.shape(), (Shape{s[0], s[3]}));
      ASSERT_EQ(y.dtype(), d);
      const std::vector<float> yv = y.to_floats();
      const int64_t hw = s[1] * s[2];
      for (int64_t n = 0; n < s[0]; ++n)
        for (int64_t c = 0; c < s[3]; ++c) {
          double sum = 0;
          for (int64_t p = 0; p < hw; ++p) sum += xv[static_cast<size_t>((n * hw + p) * s[3] + c)];
          const double mean = sum / static_cast<double>(hw);
          // hw values in [-1, 1] summed in float32: (hw + 2) 2^-24 hw of the sum, / hw; one rounding.
          EXPECT_NEAR(yv[static_cast<size_t>(n * s[3] + c)], mean,
                      2 * unit(d) * std::fabs(mean) + (hw + 2) * 0x1p-24)
              << dtype_name(d) << " " << s;
        }
      Tensor dy = random_tensor(y.shape(), 4, d);
      const std::vector<float> g = dy.to_floats(), dx = global_average_pool2d_backward(dy, s, d).to_floats();
      for (int64_t n = 0; n < s[0]; ++n)
        for (int64_t p = 0; p < hw; ++p)
          for (int64_t c = 0; c < s[3]; ++c) {
            const double want = g[static_cast<size_t>(n * s[3] + c)] / static_cast<double>(hw);
            EXPECT_NEAR(dx[static_cast<size_t>((n * hw + p) * s[3] + c)], want, 2 * unit(d) * std::fabs(want) + 1e-12);
          }
    }
}

TEST(Pool2d, BadArgumentsThrow) {
  EXPECT_THROW(max_pool2d(Tensor::zeros({1, 3, 3}, DType::kFloat32), {}), Error);
  EXPECT_THROW(max_pool2d(Tensor::zeros({1, 1, 1, 2}, DType::kFloat32), {2, 2, Padding::kValid}), Error);
  EXPECT_THROW(avg_pool2d(Tensor::zeros({1, 4, 4, 2}, DType::kFloat32), {0, 1, Padding::kValid}), Error);
  EXPECT_THROW(max_pool2d_backward(Tensor::zeros({1, 1, 1, 2}, DType::kFloat32), Tensor::zeros({1, 4, 4, 2}, DType::kFloat32),
                                   {2, 2, Padding::kValid}),
               Error);
}

}  // namespace
}  // namespace mixtrain::ops
