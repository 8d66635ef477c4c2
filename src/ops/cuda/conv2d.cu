// conv2d on the GPU (ops/conv2d.h), forward and backward: the CPU kernel's plan (cpu/conv2d.cpp) with an im2col and a
// col2im kernel around the backend's cuBLASLt GEMM (matmul.cpp), so the dtype contract is the CPU's: 16-bit inputs
// multiply with float32 accumulation, the bias is added to the float32 sum and the output is rounded once (beside a
// 16-bit output, the bias rounded to its dtype: cuBLASLt's documented bias type, gemm_plan_cache.h's gemm_bias_dtype);
// dkernel is float32; dx gathers its float32 patch gradients and is rounded once.
//
// Forward:  col (rows, K) = patches of a chunk of images (a bit copy of x's elements, zeros in the padding);
//           y (rows, cout) = col x kernel (K, cout) + bias.
// Backward: dkernel (K, cout) = sum over the chunks of col^T x dy, each chunk's product in float32 (the first one
//           straight into dkernel, later ones through a float32 scratch added elementwise);
//           dcol (rows, K) = dy x kernel^T in float32, folded into dx (col2im: one thread per dx element, summing
//           in the CPU's order through ops/shared/conv_patches.h);
//           dbias = dy's column sums through the CPU's blocks of rows (one thread per block and column, then one per
//           column in block order).
// A 1x1 kernel with stride 1 and no padding needs no unfolding: x itself is col and dx = dy x kernel^T directly.
//
// Bits: the unfolding, the folding's order and dbias give the CPU's bits, but cuBLASLt sums each product's K terms in
// its own order (blocked, perhaps split), not kernels::gemm's, so y, dkernel and dx differ from the CPU in float32's
// last places before their rounding: each element is within about K (or rows, for dkernel) float32 units of the sum
// of its terms' magnitudes of the CPU's value, then one rounding into the output dtype on each side (the tolerance
// tests/ops/cuda_cnn_test.cpp allows, as for matmul).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "../shared/conv_patches.h"
#include "../shared/float16_convert.h"
#include "backend.h"
#include "device_util.cuh"
#include "mixtrain/ops/conv2d.h"

namespace mixtrain::ops::cuda {

namespace {


// Patch elements per chunk: the unfolded patches in the compute dtype plus, in backward, their float32 gradient
// (at most 256 MiB together in float32). Larger than the CPU's chunks (a GPU's memory is meant for it, and fewer,
// larger GEMMs keep it busy); the chunking does not change any result's bits but dkernel's summation order,
// which differs from the CPU's anyway.
constexpr int64_t kChunkElements = int64_t{32} << 20;

// col (rows, K) of images [n0, ...): element (r, kk) copies x's tap bits, or is zero in the padding (all-zero bits
// are +0 in every float dtype). T: uint32_t for float32, uint16_t for the 16-bit dtypes.
template <typename T>
__global__ void im2col_kernel(const T* x, Window2d g, int64_t n0, int64_t rows, int64_t k, T* col) {
  device::for_each_index(rows * k, [&](int64_t i) {
    const int64_t src = shared::im2col_source(g, n0, i / k, i % k);
    col[i] = src < 0 ? T{0} : x[src];
  });
}

// dx elements of images [n0, n0 + count) from the chunk's dcol (rows, K) float32, times alpha, rounded once.
__global__ void col2im_kernel(const float* dcol, Window2d g, int64_t n0, int64_t count, float alpha, void* dx,
                              int dx_code) {
  const int64_t c = g.channels, per_image = g.h.in * g.w.in * c;
  device::for_each_index(count * per_image, [&](int64_t i) {
    const int64_t ch = i % c, p = i / c;
    const int64_t iw = p % g.w.in, ih = (p / g.w.in) % g.h.in, ln = p / (g.w.in * g.h.in);
    const float sum = shared::col2im_value(dcol, g, ln, ih, iw, ch);
    shared::store_from_float(dx, dx_code, n0 * per_image + i, alpha == 1.0f ? sum : shared::mul_rn(sum, alpha));
  });
}

// acc[i] += add[i] (float32), for dkernel's later chunks.
__global__ void accumulate_kernel(float* acc, const float* add, int64_t n) {
  device::for_each_index(n, [&](int64_t i) { acc[i] = shared::add_rn(acc[i], add[i]); });
}


// x itself is col (and dx = dy x kernel^T): a 1x1 kernel, stride 1, no padding, and at least one channel (an empty
// patch takes the unfolded path, where the GEMM reads nothing).
bool is_identity(const Window2d& g) {
  return g.channels > 0 && g.h.window == 1 && g.w.window == 1 && g.h.stride == 1 && g.w.stride == 1 && g.h.pad_before == 0 &&
         g.w.pad_before == 0;
}

int64_t images_per_chunk(const Window2d& g, int64_t k) {
  const int64_t per_image = std::max<int64_t>(1, g.h.out * g.w.out * k);
  return std::clamp<int64_t>(kChunkElements / per_image, 1, std::max<int64_t>(g.batch, 1));
}

// Unfolds images [n0, n1) of x into col (at least (n1 - n0) * OH * OW rows of K).
void unfold(const Tensor& x, const Window2d& g, int64_t k, int64_t n0, int64_t n1, Tensor& col) {
  const int64_t rows = (n1 - n0) * g.h.out * g.w.out;
  if (rows * k == 0) return;
  if (x.dtype() == DType::kFloat32)
    im2col_kernel<<<device::blocks_for(rows * k), device::kThreads>>>(
        static_cast<const uint32_t*>(x.raw()), g, n0, rows, k, static_cast<uint32_t*>(col.raw()));
  else
    im2col_kernel<<<device::blocks_for(rows * k), device::kThreads>>>(
        static_cast<const uint16_t*>(x.raw()), g, n0, rows, k, static_cast<uint16_t*>(col.raw()));
  device::launched("conv2d im2col");
}

// One product c (m, n) = alpha op(a) op(b) [+ bias] through bmm's kernel; a, b row-major with row strides lda, ldb.
void gemm(const Tensor& a, bool trans_a, int64_t lda, const Tensor& b, bool trans_b, int64_t ldb, int64_t m,
          int64_t n, int64_t k, const Tensor& bias, Tensor c, float alpha = 1.0f) {
  scaled_bmm(a, b, bias, kernel::BmmLayout{trans_a, trans_b, m, n, k, lda, ldb, {}, {}, {}}, alpha, c);
}

// Rows [r0, r1) of t read as a (rows, cols) matrix: a view, no copy.
Tensor rows_of(const Tensor& t, int64_t cols, int64_t r0, int64_t r1) {
  return t.reshape({t.numel() / std::max<int64_t>(cols, 1), cols}).slice(0, r0, r1);
}

}  // namespace

void conv2d(const Tensor& x, const Tensor& kernel, const Tensor& bias, const Window2d& g, float alpha, Tensor& y) {
  const int64_t cout = kernel.dim(3), k = g.h.window * g.w.window * g.channels;
  const int64_t per_row = g.h.out * g.w.out;  // output rows per image
  if (y.numel() == 0) return;
  check_cuda(cudaSetDevice(x.device().index), "cudaSetDevice");
  const bool identity = is_identity(g);
  const int64_t per_chunk = identity ? std::max<int64_t>(g.batch, 1) : images_per_chunk(g, k);
  Tensor col;  // (chunk rows, K), the compute dtype
  if (!identity) col = Tensor::empty({std::max<int64_t>(per_chunk * per_row * k, 1)}, x.dtype(), x.device());
  for (int64_t n0 = 0; n0 < g.batch; n0 += per_chunk) {
    const int64_t n1 = std::min(g.batch, n0 + per_chunk);
    const int64_t r0 = n0 * per_row, r1 = n1 * per_row;
    Tensor a;
    if (identity) {
      a = rows_of(x, k, r0, r1);
    } else {
      unfold(x, g, k, n0, n1, col);
      a = col;
    }
    gemm(a, false, k, kernel, false, cout, r1 - r0, cout, k, bias, rows_of(y, cout, r0, r1), alpha);
  }
}

void conv2d_backward(const Tensor& dy, const Tensor& x, const Tensor& kernel, const Window2d& g, float dx_alpha,
                     Tensor& dx, Tensor& dkernel, Tensor& dbias) {
  const int64_t cout = kernel.dim(3), k = g.h.window * g.w.window * g.channels;
  const int64_t per_row = g.h.out * g.w.out, rows = g.batch * per_row;
  const Device device = x.device();
  check_cuda(cudaSetDevice(device.index), "cudaSetDevice");
  if (dbias.defined()) blocked_column_sums(dy, cout, shared::kConvBiasRowsPerBlock, dbias);  // dy as (rows, cout)
  if (rows == 0 || k * cout == 0) {  // no product to run: every sum is empty, +0 (all-zero bits in every dtype)
    if (dkernel.numel() > 0) check_cuda(cudaMemsetAsync(dkernel.raw(), 0, dkernel.nbytes()), "cudaMemsetAsync");
    if (dx.defined() && dx.numel() > 0) check_cuda(cudaMemsetAsync(dx.raw(), 0, dx.nbytes()), "cudaMemsetAsync");
    return;
  }

  const bool need_x = dx.defined();
  const bool identity = is_identity(g);
  const int64_t per_chunk = identity ? std::max<int64_t>(g.batch, 1) : images_per_chunk(g, k);
  Tensor col, dcol, dk_chunk;  // patches (compute dtype), their gradient (float32), a later chunk's dkernel
  if (!identity) {
    col = Tensor::empty({per_chunk * per_row * k}, x.dtype(), device);
    if (need_x) dcol = Tensor::empty({per_chunk * per_row * k}, DType::kFloat32, device);
  }
  const Tensor dk_all = dkernel.reshape({k, cout});
  for (int64_t n0 = 0; n0 < g.batch; n0 += per_chunk) {
    const int64_t n1 = std::min(g.batch, n0 + per_chunk);
    const int64_t r0 = n0 * per_row, r1 = n1 * per_row;
    const Tensor dy_c = rows_of(dy, cout, r0, r1);
    Tensor a;
    if (identity) {
      a = rows_of(x, k, r0, r1);
    } else {
      unfold(x, g, k, n0, n1, col);
      a = col;
    }
    // dkernel (K, cout) [+]= col^T (K, rows) x dy (rows, cout), in float32.
    if (n0 == 0) {
      gemm(a, true, k, dy_c, false, cout, k, cout, r1 - r0, Tensor(), dk_all);
    } else {
      if (!dk_chunk.defined()) dk_chunk = Tensor::empty({k, cout}, DType::kFloat32, device);
      gemm(a, true, k, dy_c, false, cout, k, cout, r1 - r0, Tensor(), dk_chunk);
      accumulate_kernel<<<device::blocks_for(k * cout), device::kThreads>>>(dkernel.data<float>(),
                                                                             dk_chunk.data<float>(), k * cout);
      device::launched("conv2d_backward dkernel");
    }
    if (!need_x) continue;
    const int64_t image = g.h.in * g.w.in * g.channels;
    if (identity) {
      // dx (rows, cin) = dy (rows, cout) x kernel^T (cout, cin), rounded once.
      gemm(dy_c, false, cout, kernel, true, cout, r1 - r0, k, cout, Tensor(), rows_of(dx, k, r0, r1), dx_alpha);
      continue;
    }
    // dcol (rows, K) = dy (rows, cout) x kernel^T (cout, K), float32 until col2im's rounding.
    gemm(dy_c, false, cout, kernel, true, cout, r1 - r0, k, cout, Tensor(), dcol.reshape({-1, k}).slice(0, 0, r1 - r0));
    col2im_kernel<<<device::blocks_for((n1 - n0) * image), device::kThreads>>>(
        dcol.data<float>(), g, n0, n1 - n0, dx_alpha, dx.raw(), shared::float_code(dx.dtype()));
    device::launched("conv2d_backward col2im");
  }
}

void register_conv2d_kernels(Kernels& k) {
  k.set<Op::conv2d>(&conv2d);
  k.set<Op::conv2d_backward>(&conv2d_backward);
}

}  // namespace mixtrain::ops::cuda
