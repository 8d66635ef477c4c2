// Pooling's window arithmetic (the ops: ops/pooling.h), float32 whatever the storage dtype, written once for the
// CPU kernel (cpu/pooling.cpp, which takes its windows, its running maximum and its averaging factor from here)
// and the GPU kernel (cuda/pooling.cu, which computes each output element with the functions below).
//
// The CPU's order, per output element (image n, oh, ow, channel ch):
//   max:      m = -inf, then m = pool_take_max(x, m) over the window's rows ih, then its columns iw, in order
//   average:  s = +0, then s += x in the same order, then s * (1 / count), count = the positions inside the image
// and per input element of the backward (a float32 sum from +0, each partial sum rounded, rounded once into dx):
//   average:  dy[oh, ow] * (1 / count) over the windows covering it, rows oh then columns ow in increasing order
//   max:      dy[oh, ow] over the same windows, in the same order, for each window whose maximum (the first
//             position, in the forward's scan order, holding a value larger than all before it; NaN never wins)
//             is this element
// A GPU kernel that gives each output element (forward) or input element (backward) one thread running these
// loops gives the CPU's bits.
#pragma once

#include <cstdint>

#include "host_device.h"
#include "mixtrain/ops/conv2d.h"

namespace mixtrain::ops::shared {

// Indices [begin, end) along one axis.
struct IndexRange {
  int64_t begin, end;
};

// The input positions [begin, end) of output position o's window along axis a, cut by the image's edges.
MIXTRAIN_HOST_DEVICE inline IndexRange window_span(const Axis& a, int64_t o) {
  const int64_t start = o * a.stride - a.pad_before;
  const int64_t end = start + a.window;
  return {start > 0 ? start : 0, end < a.in ? end : a.in};
}

// The output positions [begin, end) whose windows along axis a contain input position i (empty when none does).
MIXTRAIN_HOST_DEVICE inline IndexRange covering_windows(const Axis& a, int64_t i) {
  // o covers i when o * stride - pad <= i < o * stride - pad + window.
  const int64_t hi = i + a.pad_before;  // o * stride <= hi
  const int64_t lo = hi - a.window + 1;  // o * stride >= lo
  int64_t begin = lo <= 0 ? 0 : (lo + a.stride - 1) / a.stride;
  int64_t end = hi / a.stride + 1;  // hi >= 0: i and pad_before are not negative
  if (end > a.out) end = a.out;
  if (begin > end) begin = end;
  return {begin, end};
}

// The running maximum after v: v when larger or NaN (so NaN propagates, as TensorFlow), else m. Once m is NaN it
// stays NaN. Branch-free, so the CPU's loops over channels vectorise.
MIXTRAIN_HOST_DEVICE inline float pool_take_max(float v, float m) { return (v > m || v != v) ? v : m; }

// 1 / count in float32: the factor an average window's sum is multiplied by.
MIXTRAIN_HOST_DEVICE inline float pool_average_factor(const IndexRange& rows, const IndexRange& cols) {
  return div_rn(1.0f, static_cast<float>((rows.end - rows.begin) * (cols.end - cols.begin)));
}

// Output element (n, oh, ow, ch) of max pooling (is_max) or average pooling, before its rounding. x is the
// (N, H, W, C) input read as float32 through x[i] (any accessor: a float32 buffer, a FloatView).
template <typename X>
MIXTRAIN_HOST_DEVICE inline float pool_window_value(const X& x, bool is_max, const Window2d& g, int64_t n,
                                                    int64_t oh, int64_t ow, int64_t ch) {
  const IndexRange sh = window_span(g.h, oh), sw = window_span(g.w, ow);
  const int64_t c = g.channels;
  float acc = is_max ? -INFINITY : 0.0f;
  for (int64_t ih = sh.begin; ih < sh.end; ++ih)
    for (int64_t iw = sw.begin; iw < sw.end; ++iw) {
      const float v = x[((n * g.h.in + ih) * g.w.in + iw) * c + ch];
      acc = is_max ? pool_take_max(v, acc) : add_rn(acc, v);
    }
  return is_max ? acc : mul_rn(acc, pool_average_factor(sh, sw));
}

// The position (ih * W + iw) within its image of the maximum of window (n, oh, ow) on channel ch, as the
// backward routes the gradient: the first position holding a value larger than every one before it (NaN never
// larger), the window's first position when none is (all -inf or NaN).
template <typename X>
MIXTRAIN_HOST_DEVICE inline int64_t max_pool_argmax(const X& x, const Window2d& g, int64_t n, int64_t oh,
                                                    int64_t ow, int64_t ch) {
  const IndexRange sh = window_span(g.h, oh), sw = window_span(g.w, ow);
  const int64_t c = g.channels, w = g.w.in;
  float m = -INFINITY;
  int64_t at = sh.begin * w + sw.begin;
  for (int64_t ih = sh.begin; ih < sh.end; ++ih)
    for (int64_t iw = sw.begin; iw < sw.end; ++iw) {
      const float v = x[((n * g.h.in + ih) * w + iw) * c + ch];
      if (v > m) {
        m = v;
        at = ih * w + iw;
      }
    }
  return at;
}

// Input element (n, ih, iw, ch)'s gradient, before its rounding, from dy (N, OH, OW, C) read as float32 through
// dy[i]. For max pooling, argmax[i] is max_pool_argmax of output element i (any accessor returning int64_t);
// average pooling leaves it unread.
template <typename Dy, typename Argmax>
MIXTRAIN_HOST_DEVICE inline float pool_input_grad(const Dy& dy, const Argmax& argmax, bool is_max, const Window2d& g,
                                                  int64_t n, int64_t ih, int64_t iw, int64_t ch) {
  const IndexRange oh_r = covering_windows(g.h, ih), ow_r = covering_windows(g.w, iw);
  const int64_t c = g.channels, here = ih * g.w.in + iw;
  float acc = 0.0f;
  for (int64_t oh = oh_r.begin; oh < oh_r.end; ++oh) {
    const IndexRange sh = window_span(g.h, oh);
    for (int64_t ow = ow_r.begin; ow < ow_r.end; ++ow) {
      const int64_t o = ((n * g.h.out + oh) * g.w.out + ow) * c + ch;
      if (is_max) {
        if (argmax[o] == here) acc = add_rn(acc, dy[o]);
      } else {
        acc = add_rn(acc, mul_rn(dy[o], pool_average_factor(sh, window_span(g.w, ow))));
      }
    }
  }
  return acc;
}

// Global average pooling: channel ch of image n, the mean of its (pixels) positions summed from +0 in order, then
// multiplied by 1 / pixels (0 for an empty image). x (N, pixels, C) read as float32 through x[i].
MIXTRAIN_HOST_DEVICE inline float global_average_factor(int64_t pixels) {
  return pixels > 0 ? div_rn(1.0f, static_cast<float>(pixels)) : 0.0f;
}
template <typename X>
MIXTRAIN_HOST_DEVICE inline float global_average_value(const X& x, int64_t pixels, int64_t c, int64_t n, int64_t ch) {
  float s = 0.0f;
  for (int64_t p = 0; p < pixels; ++p) s = add_rn(s, x[(n * pixels + p) * c + ch]);
  return mul_rn(s, global_average_factor(pixels));
}

}  // namespace mixtrain::ops::shared
