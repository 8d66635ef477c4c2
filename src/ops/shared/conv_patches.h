// conv2d's unfolding and folding (the op: ops/conv2d.h), written once for the CPU kernel (cpu/conv2d.cpp) and the
// GPU kernel (cuda/conv2d.cu). The GEMM between them is each backend's own (kernels::gemm on the CPU, cuBLASLt on
// the GPU), so only these steps are shared.
//
// The patches of images [n0, n0 + count) form a (count * OH * OW, K) matrix, K = kh * kw * cin in (ki, kj, c)
// order (the Keras kernel (kh, kw, cin, cout) read as (K, cout)); a tap outside the image is zero. Folding back
// (col2im) gives input element (n, ih, iw, ch) the float32 sum, from +0, of its patch entries, kernel rows ki in
// increasing order, then output columns ow in increasing order, each partial sum rounded, then one rounding into
// dx's dtype. The CPU adds runs of a patch row into an image row in that same order (its vectorised scatter is
// faster than this per-element gather, so it keeps its own loop: the bits are the same).
// dbias sums dy's rows through fixed blocks of kConvBiasRowsPerBlock rows: each block from +0 in row order, then
// the blocks' sums from +0 in block order (ordered_sum.h's blocked_row_sum with this block size).
#pragma once

#include <cstdint>

#include "host_device.h"
#include "mixtrain/ops/conv2d.h"
#include "pool_window.h"

namespace mixtrain::ops::shared {

// Rows per block of dbias's column sums. Part of the result's bits: both backends use this value.
constexpr int64_t kConvBiasRowsPerBlock = 1024;

// The element of x (N, H, W, C) that patch matrix element (r, kk) copies, or -1 where the tap falls in the
// padding. r counts rows from image n0's first.
MIXTRAIN_HOST_DEVICE inline int64_t im2col_source(const Window2d& g, int64_t n0, int64_t r, int64_t kk) {
  const int64_t c = g.channels, kw = g.w.window;
  const int64_t per_image = g.h.out * g.w.out;
  const int64_t n = n0 + r / per_image, p = r % per_image;
  const int64_t oh = p / g.w.out, ow = p % g.w.out;
  const int64_t ki = kk / (kw * c), kj = (kk / c) % kw, ch = kk % c;
  const int64_t ih = oh * g.h.stride - g.h.pad_before + ki, iw = ow * g.w.stride - g.w.pad_before + kj;
  if (ih < 0 || ih >= g.h.in || iw < 0 || iw >= g.w.in) return -1;
  return ((n * g.h.in + ih) * g.w.in + iw) * c + ch;
}

// Input element (ln, ih, iw, ch) of the images of one chunk (ln counts from the chunk's first image), folded from
// the chunk's patch gradients dcol (rows, K) read as float32 through dcol[i], before its rounding.
template <typename DCol>
MIXTRAIN_HOST_DEVICE inline float col2im_value(const DCol& dcol, const Window2d& g, int64_t ln, int64_t ih,
                                               int64_t iw, int64_t ch) {
  const int64_t c = g.channels, kw = g.w.window, k = g.h.window * kw * c;
  // The output columns whose windows hold iw (their tap kj = iw - (ow * stride - pad) lies in [0, kw)).
  const IndexRange ows = covering_windows(g.w, iw);
  float acc = 0.0f;
  for (int64_t ki = 0; ki < g.h.window; ++ki) {
    const int64_t t = ih + g.h.pad_before - ki;
    if (t < 0 || t % g.h.stride != 0) continue;
    const int64_t oh = t / g.h.stride;
    if (oh >= g.h.out) continue;
    for (int64_t ow = ows.begin; ow < ows.end; ++ow) {
      const int64_t kj = iw - (ow * g.w.stride - g.w.pad_before);
      acc = add_rn(acc, dcol[((ln * g.h.out + oh) * g.w.out + ow) * k + (ki * kw + kj) * c + ch]);
    }
  }
  return acc;
}

}  // namespace mixtrain::ops::shared
