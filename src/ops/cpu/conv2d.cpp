// CPU backend of conv2d: im2col over a chunk of whole images, then one GEMM per chunk.
//
// Forward:  col (rows, K) = patches of x, rows = images * OH * OW, K = kh * kw * cin in (ki, kj, c) order,
//           which is the row order of the Keras kernel (kh, kw, cin, cout) read as a (K, cout) matrix;
//           y (rows, cout) = alpha (col x kernel) + bias, float32 accumulation, rounded once.
// Backward: dkernel (K, cout) += col^T x dy over the chunks (float32 C, so no 16-bit rounding);
//           dcol (rows, K) = dy x kernel^T in float32, and each dx element gathers its (at most kh * kw)
//           patch entries in float32 and is rounded once (col2im).
// y and dx are rounded into their own dtypes, x's or float32 (ops/conv2d.h).
// A 1x1 kernel with stride 1 and no padding needs no unfolding: x itself is col.
// The patch layout, col2im's summation order and dbias's blocks are ops/shared/conv_patches.h's, which the GPU
// kernel follows element by element.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "../shared/conv_patches.h"
#include "mixtrain/kernels/gemm.h"
#include "mixtrain/ops/conv2d.h"
#include "column_sums.h"
#include "cpu_backend.h"

namespace mixtrain::ops::cpu {

namespace {

// Patch elements per chunk: the unfolded patches (in the compute dtype: 8 MiB in float32, 4 MiB in 16
// bits) and, in backward, their float32 gradient (8 MiB). Large enough that each GEMM has thousands of
// rows (the Fashion CNN's 3x3x32 convolution: 37 images, 7252 rows), small enough that the workspace stays
// well below a training step's activations, and smaller in 16 bits, as they are.
constexpr int64_t kChunkElements = int64_t{2} << 20;

struct ConvDims {
  int64_t n, h, w, c;    // input
  int64_t oh, ow, cout;  // output
  int64_t kh, kw, sh, sw, ph, pw;
  int64_t k;  // kh * kw * c: the GEMM depth
  bool identity;  // 1x1, stride 1, no padding: col is x
};

ConvDims dims_of(const Window2d& g, const Tensor& kernel) {
  ConvDims d{};
  d.n = g.batch;
  d.h = g.h.in;
  d.w = g.w.in;
  d.c = g.channels;
  d.oh = g.h.out;
  d.ow = g.w.out;
  d.cout = kernel.dim(3);
  d.kh = g.h.window;
  d.kw = g.w.window;
  d.sh = g.h.stride;
  d.sw = g.w.stride;
  d.ph = g.h.pad_before;
  d.pw = g.w.pad_before;
  d.k = d.kh * d.kw * d.c;
  d.identity = d.kh == 1 && d.kw == 1 && d.sh == 1 && d.sw == 1 && d.ph == 0 && d.pw == 0;
  return d;
}

// Images per chunk so that the chunk's patches (OH * OW rows of K elements an image) fit kChunkElements.
int64_t images_per_chunk(const ConvDims& d) {
  const int64_t per_image = std::max<int64_t>(1, d.oh * d.ow * d.k);
  return std::clamp<int64_t>(kChunkElements / per_image, 1, std::max<int64_t>(d.n, 1));
}

// Copies n bytes. The runs im2col copies are short (a few channels: 12 bytes for a 3-wide kernel row on
// one channel), where a call to memcpy costs more than the copy; constant-size copies compile to moves.
inline void copy_run(char* d, const char* s, size_t n) {
  if (n >= 256) {
    std::memcpy(d, s, n);
  } else if (n >= 16) {
    for (size_t i = 0; i + 16 <= n; i += 16) std::memcpy(d + i, s + i, 16);
    std::memcpy(d + n - 16, s + n - 16, 16);  // the tail, overlapping what is already copied
  } else if (n >= 8) {
    std::memcpy(d, s, 8);
    std::memcpy(d + n - 8, s + n - 8, 8);
  } else if (n >= 4) {
    std::memcpy(d, s, 4);
    std::memcpy(d + n - 4, s + n - 4, 4);
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = s[i];
  }
}

// col (images [n0, n1) * OH * OW, K) <- patches of x (N, H, W, C); out-of-image taps are zero (all-zero
// bits are 0.0 in every float dtype). Parallel over output rows (image, oh).
void im2col(const char* x, const ConvDims& d, size_t es, int64_t n0, int64_t n1, char* col) {
  const int64_t rows = (n1 - n0) * d.oh;
  const size_t tap_bytes = static_cast<size_t>(d.c) * es;
  const size_t row_bytes = static_cast<size_t>(d.kw) * tap_bytes;  // one kernel row of a patch
#pragma omp parallel for schedule(static) if (rows * d.ow * d.k > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = n0 + r / d.oh, oh = r % d.oh;
    char* dst = col + static_cast<size_t>(r * d.ow * d.k) * es;
    for (int64_t ow = 0; ow < d.ow; ++ow) {
      const int64_t iw0 = ow * d.sw - d.pw;
      for (int64_t ki = 0; ki < d.kh; ++ki, dst += row_bytes) {
        const int64_t ih = oh * d.sh - d.ph + ki;
        if (ih < 0 || ih >= d.h) {
          std::memset(dst, 0, row_bytes);
          continue;
        }
        const char* src = x + static_cast<size_t>(((n * d.h + ih) * d.w) * d.c) * es;
        if (iw0 >= 0 && iw0 + d.kw <= d.w) {
          copy_run(dst, src + static_cast<size_t>(iw0 * d.c) * es, row_bytes);
          continue;
        }
        for (int64_t kj = 0; kj < d.kw; ++kj) {
          const int64_t iw = iw0 + kj;
          char* t = dst + static_cast<size_t>(kj) * tap_bytes;
          if (iw < 0 || iw >= d.w)
            std::memset(t, 0, tap_bytes);
          else
            copy_run(t, src + static_cast<size_t>(iw * d.c) * es, tap_bytes);
        }
      }
    }
  }
}

// dx rows of images [n0, n1) <- alpha times the sum of their patch gradients dcol (float32, rows as im2col's), each
// element summed and scaled in float32 and rounded once into dx's dtype. Parallel over input rows (image, ih): each
// gathers from the output rows whose windows cover it, so no two threads write the same element.
void col2im(const float* dcol, const ConvDims& d, int64_t n0, int64_t n1, float alpha, DType dx_dtype, char* dx) {
  const int64_t rows = (n1 - n0) * d.h;
  const size_t es = dtype_size(dx_dtype);
  const int64_t row_elems = d.w * d.c;
#pragma omp parallel
  {
    // A float32 dx row is its own accumulator; a 16-bit one sums in float32 and is rounded once.
    std::vector<float> acc_buf(dx_dtype == DType::kFloat32 ? 0 : static_cast<size_t>(row_elems));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t ln = r / d.h, ih = r % d.h;  // ln: image within the chunk
      char* dst = dx + static_cast<size_t>(((n0 + ln) * d.h + ih) * row_elems) * es;
      float* acc = dx_dtype == DType::kFloat32 ? reinterpret_cast<float*>(dst) : acc_buf.data();
      std::fill(acc, acc + row_elems, 0.0f);
      for (int64_t ki = 0; ki < d.kh; ++ki) {
        const int64_t t = ih + d.ph - ki;
        if (t < 0 || t % d.sh != 0) continue;
        const int64_t oh = t / d.sh;
        if (oh >= d.oh) continue;
        for (int64_t ow = 0; ow < d.ow; ++ow) {
          const float* src = dcol + ((ln * d.oh + oh) * d.ow + ow) * d.k + ki * d.kw * d.c;
          const int64_t iw0 = ow * d.sw - d.pw;
          const int64_t kj0 = std::max<int64_t>(0, -iw0), kj1 = std::min(d.kw, d.w - iw0);
          if (kj0 >= kj1) continue;
          // Taps kj0..kj1 land on consecutive pixels: one run of (kj1 - kj0) * C elements.
          float* a = acc + (iw0 + kj0) * d.c;
          const float* s = src + kj0 * d.c;
          const int64_t len = (kj1 - kj0) * d.c;
          for (int64_t i = 0; i < len; ++i) a[i] += s[i];
        }
      }
      if (alpha != 1.0f)
        for (int64_t i = 0; i < row_elems; ++i) acc[i] *= alpha;
      if (dx_dtype != DType::kFloat32) convert_elements(acc, DType::kFloat32, dst, dx_dtype, row_elems);
    }
  }
}

}  // namespace

void conv2d(const Tensor& x, const Tensor& kernel, const Tensor& bias, const Window2d& g, float alpha, Tensor& y) {
  const ConvDims d = dims_of(g, kernel);
  const DType dt = x.dtype();
  const size_t es = dtype_size(dt);
  const char* xp = static_cast<const char*>(x.raw());
  char* yp = static_cast<char*>(y.raw());
  const float* bp = bias.defined() ? static_cast<const float*>(bias.raw()) : nullptr;
  const int64_t per_chunk = d.identity ? std::max<int64_t>(d.n, 1) : images_per_chunk(d);  // x is col: one GEMM
  Tensor col;  // (chunk rows, K), the compute dtype
  if (!d.identity) col = Tensor::empty({per_chunk * d.oh * d.ow, d.k}, dt);
  for (int64_t n0 = 0; n0 < d.n; n0 += per_chunk) {
    const int64_t n1 = std::min(d.n, n0 + per_chunk);
    const int64_t rows = (n1 - n0) * d.oh * d.ow;
    const char* a = xp + static_cast<size_t>(n0 * d.h * d.w * d.c) * es;
    if (!d.identity) {
      im2col(xp, d, es, n0, n1, static_cast<char*>(col.raw()));
      a = static_cast<const char*>(col.raw());
    }
    kernels::scaled_gemm(false, false, rows, d.cout, d.k, dt, a, d.k, kernel.raw(), d.cout, alpha, bp, y.dtype(),
                         yp + static_cast<size_t>(n0 * d.oh * d.ow * d.cout) * dtype_size(y.dtype()), d.cout);
  }
}

void conv2d_backward(const Tensor& dy, const Tensor& x, const Tensor& kernel, const Window2d& g, float dx_alpha,
                     Tensor& dx, Tensor& dkernel, Tensor& dbias) {
  const ConvDims d = dims_of(g, kernel);
  const DType dt = x.dtype();
  const size_t es = dtype_size(dt);
  const char* xp = static_cast<const char*>(x.raw());
  const char* dyp = static_cast<const char*>(dy.raw());
  float* dw = static_cast<float*>(dkernel.raw());
  std::fill(dw, dw + d.k * d.cout, 0.0f);
  if (dbias.defined())
    blocked_column_sums(dyp, dt, d.n * d.oh * d.ow, d.cout, shared::kConvBiasRowsPerBlock,
                        static_cast<float*>(dbias.raw()));

  const bool need_x = dx.defined();
  const int64_t per_chunk = d.identity ? std::max<int64_t>(d.n, 1) : images_per_chunk(d);  // x is col: one GEMM
  Tensor col, dcol;  // (chunk rows, K): patches in the compute dtype, their gradient in float32
  if (!d.identity) {
    col = Tensor::empty({per_chunk * d.oh * d.ow, d.k}, dt);
    if (need_x) dcol = Tensor::empty({per_chunk * d.oh * d.ow, d.k}, DType::kFloat32);
  }
  for (int64_t n0 = 0; n0 < d.n; n0 += per_chunk) {
    const int64_t n1 = std::min(d.n, n0 + per_chunk);
    const int64_t rows = (n1 - n0) * d.oh * d.ow;
    const char* dy_c = dyp + static_cast<size_t>(n0 * d.oh * d.ow * d.cout) * es;
    const char* a = xp + static_cast<size_t>(n0 * d.h * d.w * d.c) * es;
    if (!d.identity) {
      im2col(xp, d, es, n0, n1, static_cast<char*>(col.raw()));
      a = static_cast<const char*>(col.raw());
    }
    // dkernel (K, cout) += col^T (K, rows) x dy (rows, cout), float32 throughout.
    kernels::gemm(true, false, d.k, d.cout, rows, dt, a, d.k, dy_c, d.cout, DType::kFloat32, dw, d.cout,
                  /*accumulate=*/true, nullptr);
    if (!need_x) continue;
    char* dx_c = static_cast<char*>(dx.raw()) + static_cast<size_t>(n0 * d.h * d.w * d.c) * dtype_size(dx.dtype());
    if (d.identity) {
      // dx (rows, cin) = dy (rows, cout) x kernel^T (cout, cin), rounded once.
      kernels::scaled_gemm(false, true, rows, d.k, d.cout, dt, dy_c, d.cout, kernel.raw(), d.cout, dx_alpha, nullptr,
                           dx.dtype(), dx_c, d.k);
      continue;
    }
    // dcol (rows, K) = dy (rows, cout) x kernel^T (cout, K), kept in float32 until col2im's rounding.
    float* dc = static_cast<float*>(dcol.raw());
    kernels::gemm(false, true, rows, d.k, d.cout, dt, dy_c, d.cout, kernel.raw(), d.cout, DType::kFloat32, dc, d.k,
                  false, nullptr);
    col2im(dc, d, n0, n1, dx_alpha, dx.dtype(), static_cast<char*>(dx.raw()));
  }
}

void register_conv2d_kernels(Kernels& k) {
  k.set<Op::conv2d>(&conv2d);
  k.set<Op::conv2d_backward>(&conv2d_backward);
}

}  // namespace mixtrain::ops::cpu
