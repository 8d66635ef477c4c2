// CPU backend of the pooling ops. Input rows are read as float32 (16-bit ones converted, vectorised,
// whole rows at a time), windows are reduced in float32 with channels innermost, and each result is
// rounded once. The windows, the running maximum and the averaging factor are ops/shared/pool_window.h's,
// which the GPU kernel computes each element with, in this file's order.
// Forward is parallel over output rows (image, oh); backward over images, each scattering into its own
// float32 accumulator, so no two threads write the same element and the bits do not depend on threads.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "../shared/pool_window.h"
#include "mixtrain/ops/pooling.h"
#include "float_lanes.h"
#include "cpu_backend.h"

namespace mixtrain::ops::cpu {

namespace {

using Span = shared::IndexRange;
using shared::pool_take_max;

// The window positions [begin, end) inside the input for output index o along one axis.
inline Span span(const Axis& a, int64_t o) { return shared::window_span(a, o); }

}  // namespace

namespace {

// Output row r (image, oh) of pool2d: input rows read as float32 (16-bit ones converted a row at a time),
// reduced in float32, rounded once.
template <typename T>
MIXTRAIN_CPU_BODY void pool_row_body(const T* xp, T* yp, PoolKind kind, const Window2d& g, int64_t r, float* in_buf,
                                  float* out_buf) {
  const int64_t c = g.channels, w = g.w.in, ow_n = g.w.out, oh_n = g.h.out;
  const int64_t n = r / oh_n, oh = r % oh_n;
  const Span sh = span(g.h, oh);
  T* dst = yp + r * ow_n * c;
  float* out = lanes::out(dst, out_buf);
  std::fill(out, out + ow_n * c, kind == PoolKind::kMax ? -std::numeric_limits<float>::infinity() : 0.0f);
  for (int64_t ih = sh.begin; ih < sh.end; ++ih) {
    const float* in = lanes::read(xp + ((n * g.h.in + ih) * w) * c, w * c, in_buf);
    for (int64_t ow = 0; ow < ow_n; ++ow) {
      const Span sw = span(g.w, ow);
      float* o = out + ow * c;
      for (int64_t iw = sw.begin; iw < sw.end; ++iw) {
        const float* v = in + iw * c;
        if (kind == PoolKind::kMax) {
          for (int64_t ch = 0; ch < c; ++ch) o[ch] = pool_take_max(v[ch], o[ch]);
        } else {
          for (int64_t ch = 0; ch < c; ++ch) o[ch] += v[ch];
        }
      }
    }
  }
  if (kind == PoolKind::kAverage) {
    for (int64_t ow = 0; ow < ow_n; ++ow) {
      const Span sw = span(g.w, ow);
      const float inv = shared::pool_average_factor(sh, sw);
      for (int64_t ch = 0; ch < c; ++ch) out[ow * c + ch] *= inv;
    }
  }
  lanes::write(out, ow_n * c, dst);
}
MIXTRAIN_CPU_VARIANTS(pool_row)

}  // namespace

void pool2d(const Tensor& x, PoolKind kind, const Window2d& g, Tensor& y) {
  const int64_t c = g.channels, w = g.w.in, ow_n = g.w.out, oh_n = g.h.out;
  const int64_t rows = g.batch * oh_n;
  dispatch_float(x.dtype(), "pool2d", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.raw());
    T* yp = static_cast<T*>(y.raw());
#pragma omp parallel if (rows * ow_n * c > 32768)
    {
      std::vector<float> in_buf(static_cast<size_t>(w * c)), out(static_cast<size_t>(ow_n * c));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) pool_row(xp, yp, kind, g, r, in_buf.data(), out.data());
    }
  });
}

namespace {

// Image n of pool2d_backward: x and dx in T, dy in U. A float32 dx is its own accumulator; a 16-bit one
// sums in float32 (acc_buf) and is rounded once.
template <typename T, typename U>
MIXTRAIN_CPU_BODY void pool_backward_image_body(const U* dyp, const T* xp, T* dxp, PoolKind kind, const Window2d& g,
                                             int64_t n, float* acc_buf, float* win_buf, float* grad_buf,
                                             float* best, int32_t* where) {
  const int64_t c = g.channels, h = g.h.in, w = g.w.in, ow_n = g.w.out, oh_n = g.h.out;
  T* dst = dxp + n * h * w * c;
  float* acc = lanes::out(dst, acc_buf);
  std::fill(acc, acc + h * w * c, 0.0f);
  for (int64_t oh = 0; oh < oh_n; ++oh) {
    const Span sh = span(g.h, oh);
    const float* grad = lanes::read(dyp + ((n * oh_n + oh) * ow_n) * c, ow_n * c, grad_buf);
    // The window's input rows, as float32 (row sh.begin first).
    const float* win =
        kind == PoolKind::kMax ? lanes::read(xp + ((n * h + sh.begin) * w) * c, (sh.end - sh.begin) * w * c, win_buf)
                               : nullptr;
    for (int64_t ow = 0; ow < ow_n; ++ow) {
      const Span sw = span(g.w, ow);
      const float* gy = grad + ow * c;
      if (kind == PoolKind::kAverage) {
        const float inv = shared::pool_average_factor(sh, sw);
        for (int64_t ih = sh.begin; ih < sh.end; ++ih)
          for (int64_t iw = sw.begin; iw < sw.end; ++iw) {
            float* a = acc + (ih * w + iw) * c;
            for (int64_t ch = 0; ch < c; ++ch) a[ch] += gy[ch] * inv;
          }
        continue;
      }
      // The first position of the window's maximum in the forward pass's scan order (rows, then
      // columns) takes the gradient. Branch-free over channels, so the scan vectorises.
      float* __restrict m = best;
      int32_t* __restrict at = where;
      const int32_t first = static_cast<int32_t>((sh.begin * w + sw.begin) * c);
      for (int64_t ch = 0; ch < c; ++ch) {
        m[ch] = -std::numeric_limits<float>::infinity();
        at[ch] = first;
      }
      for (int64_t ih = sh.begin; ih < sh.end; ++ih)
        for (int64_t iw = sw.begin; iw < sw.end; ++iw) {
          const float* __restrict v = win + ((ih - sh.begin) * w + iw) * c;
          const int32_t pos = static_cast<int32_t>((ih * w + iw) * c);
          for (int64_t ch = 0; ch < c; ++ch) {
            const float vv = v[ch], mm = m[ch];
            // Masks rather than branches, so the loop vectorises. NaN never wins here: see pooling.h.
            const int32_t wins = -static_cast<int32_t>(vv > mm);
            m[ch] = vv > mm ? vv : mm;
            at[ch] = (pos & wins) | (at[ch] & ~wins);
          }
        }
      for (int64_t ch = 0; ch < c; ++ch) acc[at[ch] + ch] += gy[ch];
    }
  }
  lanes::write(acc, h * w * c, dst);
}
MIXTRAIN_CPU_VARIANTS(pool_backward_image)

}  // namespace

void pool2d_backward(const Tensor& dy, const Tensor& x, PoolKind kind, const Window2d& g, Tensor& dx) {
  const int64_t c = g.channels, h = g.h.in, w = g.w.in, ow_n = g.w.out;
  const DType dt = dx.dtype();
  const int64_t kh = g.h.window;
  MIXTRAIN_CHECK(h * w * c <= std::numeric_limits<int32_t>::max(),
                 "max_pool2d_backward: images of " << h << "x" << w << "x" << c << " elements are too large");
  dispatch_float(dt, "pool2d_backward", [&](auto x_tag) {
    using T = decltype(x_tag);
    dispatch_float(dy.dtype(), "pool2d_backward", [&](auto dy_tag) {
      using U = decltype(dy_tag);
      const T* xp = kind == PoolKind::kMax ? static_cast<const T*>(x.raw()) : nullptr;
      const U* dyp = static_cast<const U*>(dy.raw());
      T* dxp = static_cast<T*>(dx.raw());
#pragma omp parallel if (g.batch > 1 && g.batch * h * w * c > 32768)
      {
        std::vector<float> acc_buf(dt == DType::kFloat32 ? 0 : static_cast<size_t>(h * w * c));
        std::vector<float> win_buf(kind == PoolKind::kMax && dt != DType::kFloat32 ? static_cast<size_t>(kh * w * c) : 0);
        std::vector<float> grad_buf(static_cast<size_t>(ow_n * c));
        std::vector<float> best(static_cast<size_t>(c));
        std::vector<int32_t> where(static_cast<size_t>(c));  // positions within one image (checked to fit)
#pragma omp for schedule(static)
        for (int64_t n = 0; n < g.batch; ++n)
          pool_backward_image(dyp, xp, dxp, kind, g, n, acc_buf.data(), win_buf.data(), grad_buf.data(), best.data(),
                              where.data());
      }
    });
  });
}

void global_average_pool2d(const Tensor& x, Tensor& y) {
  const int64_t n_img = x.dim(0), pixels = x.dim(1) * x.dim(2), c = x.dim(3);
  const DType dt = x.dtype();
  const size_t es = dtype_size(dt);
  const char* xp = static_cast<const char*>(x.raw());
  char* yp = static_cast<char*>(y.raw());
  constexpr int64_t kPixelsPerBlock = 64;
#pragma omp parallel if (n_img > 1 && x.numel() > 32768)
  {
    std::vector<float> buf(static_cast<size_t>(kPixelsPerBlock * c)), sum(static_cast<size_t>(c));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < n_img; ++n) {
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (int64_t p0 = 0; p0 < pixels; p0 += kPixelsPerBlock) {
        const int64_t np = std::min(kPixelsPerBlock, pixels - p0);
        convert_elements(xp + static_cast<size_t>((n * pixels + p0) * c) * es, dt, buf.data(), DType::kFloat32, np * c);
        for (int64_t p = 0; p < np; ++p)
          for (int64_t ch = 0; ch < c; ++ch) sum[static_cast<size_t>(ch)] += buf[static_cast<size_t>(p * c + ch)];
      }
      const float inv = shared::global_average_factor(pixels);
      for (float& s : sum) s *= inv;
      convert_elements(sum.data(), DType::kFloat32, yp + static_cast<size_t>(n * c) * es, dt, c);
    }
  }
}

void global_average_pool2d_backward(const Tensor& dy, Tensor& dx) {
  const int64_t n_img = dx.dim(0), pixels = dx.dim(1) * dx.dim(2), c = dx.dim(3);
  const DType dt = dx.dtype();
  const size_t es = dtype_size(dt);
  const char* dyp = static_cast<const char*>(dy.raw());
  char* dxp = static_cast<char*>(dx.raw());
  const float inv = shared::global_average_factor(pixels);
#pragma omp parallel if (n_img > 1 && dx.numel() > 32768)
  {
    std::vector<float> g(static_cast<size_t>(c));
    std::vector<char> row(static_cast<size_t>(c) * es);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < n_img; ++n) {
      convert_elements(dyp + static_cast<size_t>(n * c) * dtype_size(dy.dtype()), dy.dtype(), g.data(),
                       DType::kFloat32, c);
      for (float& v : g) v *= inv;
      convert_elements(g.data(), DType::kFloat32, row.data(), dt, c);  // rounded once, then copied
      for (int64_t p = 0; p < pixels; ++p)
        std::memcpy(dxp + static_cast<size_t>((n * pixels + p) * c) * es, row.data(), row.size());
    }
  }
}

void register_pooling_kernels(Kernels& k) {
  k.set<Op::pool2d>(&pool2d);
  k.set<Op::pool2d_backward>(&pool2d_backward);
  k.set<Op::global_average_pool2d>(&global_average_pool2d);
  k.set<Op::global_average_pool2d_backward>(&global_average_pool2d_backward);
}

}  // namespace mixtrain::ops::cpu
