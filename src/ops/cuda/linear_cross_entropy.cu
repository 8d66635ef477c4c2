// linear_cross_entropy on the GPU (ops/linear_cross_entropy.h), with the CPU kernel's plan (cpu/linear_cross_entropy.cpp):
// per chunk of rows, the backend's GEMM (bmm, over cuBLASLt: float32 sums) writes the chunk's float32 logits with
// the bias in its epilogue; one thread per row reduces its row (shared/linear_cross_entropy_row.h: log-sum-exp in
// float32, the first arg-max) and, with a seed, rewrites it in place into its dlogits; two more GEMMs give the
// chunk's rows of dx and its share of dw (into a float32 scratch, added onto dw in chunk order), and one thread per
// column adds the chunk's dbias in row order. The row losses are kept in double and summed by one thread in row
// order, the CPU's mean. A label outside [0, V) is kept in the device's label-error record (as the cross-entropy
// kernel's) and raised at the host's next read; its row's loss is NaN and its dlogits zero.
// The rows' sums run in the CPU's order; the GEMMs sum in cuBLASLt's, so results match the CPU within float32
// rounding of the products (tests/ops/cuda_linear_cross_entropy_test.cpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "../shared/linear_cross_entropy_row.h"
#include "backend.h"
#include "device_util.cuh"
#include "mixtrain/ops/linear_cross_entropy.h"

namespace mixtrain::ops::cuda {

namespace {

struct ChunkRows {
  float* z;  // (rows, v) float32 logits, then dlogits
  int64_t rows, v, first;  // first: the chunk's first row among all n
  const void* labels;
  bool labels64;
  const float* seed;  // null: no gradient
  int64_t n;
  double* loss;   // (n,) per row
  int* correct;   // (n,) per row
};

__global__ void rows_kernel(ChunkRows a, unsigned long long* first_bad_row) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= a.rows) return;
  const int64_t row = a.first + i;
  const int64_t label = a.labels64 ? static_cast<const int64_t*>(a.labels)[row]
                                   : static_cast<const int32_t*>(a.labels)[row];
  float* z = a.z + i * a.v;
  if (label < 0 || label >= a.v) {
    atomicMin(first_bad_row, static_cast<unsigned long long>(row));
    a.loss[row] = __longlong_as_double(0x7FF8000000000000ll);  // NaN: never a silent number
    a.correct[row] = 0;
    if (a.seed)
      for (int64_t j = 0; j < a.v; ++j) z[j] = 0.0f;
    return;
  }
  const float k = a.seed ? shared::linear_cross_entropy_grad_scale(a.seed[0], a.n) : 0.0f;
  const shared::LinearCrossEntropyRow r = shared::linear_cross_entropy_row(z, a.v, label, a.seed != nullptr, k);
  a.loss[row] = r.loss;
  a.correct[row] = r.correct ? 1 : 0;
}

// dbias[j] (+)= column j of the chunk's dlogits, in row order.
__global__ void bias_kernel(const float* g, int64_t rows, int64_t v, bool first, float* dbias) {
  device::for_each_index(v, [&](int64_t j) {
    dbias[j] = shared::linear_cross_entropy_bias_grad(g, rows, v, j, first ? 0.0f : dbias[j]);
  });
}

__global__ void add_kernel(const float* src, int64_t n, float* dst) {
  device::for_each_index(n, [&](int64_t i) { dst[i] = shared::add_rn(dst[i], src[i]); });
}

// One thread: the mean of the row losses (double, row order, rounded once to float32) and the count of correct rows.
__global__ void finish_kernel(const double* row_loss, const int* row_correct, int64_t n, float* loss, float* correct) {
  double total = 0.0;
  int64_t hits = 0;
  for (int64_t i = 0; i < n; ++i) {
    total = __dadd_rn(total, row_loss[i]);
    hits += row_correct[i];
  }
  loss[0] = static_cast<float>(n ? __ddiv_rn(total, static_cast<double>(n)) : 0.0);
  correct[0] = static_cast<float>(hits);
}

constexpr int kRowThreads = 128;

kernel::BmmLayout product(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb) {
  kernel::BmmLayout l;
  l.trans_a = trans_a;
  l.trans_b = trans_b;
  l.m = m;
  l.n = n;
  l.k = k;
  l.lda = lda;
  l.ldb = ldb;
  return l;
}

// The chunk's gradients from its dlogits zc (c, V) float32: dx rows, dw (written by the first chunk, then added),
// dbias.
void chunk_gradients(const Tensor& xc, const Tensor& w, Tensor& zc, Tensor& g16, bool first, Tensor& dx_rows,
                     Tensor& dw, Tensor& dw_part, Tensor& dbias) {
  const int64_t c = xc.dim(0), d = xc.dim(1), v = w.dim(1);
  // dlogits in the operands' dtype, as linear_backward casts its dy before its products.
  Tensor g = zc;
  if (xc.dtype() != DType::kFloat32) {
    g = g16.slice(0, 0, c);
    round_rows_into(zc.data<float>(), nullptr, c, v, g.raw(), g.dtype());
  }
  bmm(g, w, Tensor(), product(false, true, c, d, v, v, v), dx_rows);  // (c, D) = (c, V) x (V, D)
  Tensor& dw_into = first ? dw : dw_part;
  bmm(xc, g, Tensor(), product(true, false, d, v, c, d, v), dw_into);  // (D, V) = (D, c) x (c, V)
  if (!first) {
    add_kernel<<<device::blocks_for(dw.numel()), device::kThreads>>>(dw_part.data<float>(), dw.numel(),
                                                                     dw.data<float>());
    device::launched("linear_cross_entropy (dw)");
  }
  if (dbias.defined()) {
    bias_kernel<<<device::blocks_for(v), device::kThreads>>>(zc.data<float>(), c, v, first, dbias.data<float>());
    device::launched("linear_cross_entropy (dbias)");
  }
}

}  // namespace

void linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& labels,
                          const Tensor& seed, int64_t chunk_rows, Tensor& loss, Tensor& correct, Tensor& dx,
                          Tensor& dw, Tensor& dbias) {
  const Device device = x.device();
  check_cuda(cudaSetDevice(device.index), "cudaSetDevice");
  const int64_t n = x.dim(0), d = x.dim(1), v = w.dim(1);
  const bool grad = seed.defined();
  const int64_t chunk = std::min(chunk_rows, std::max<int64_t>(n, 1));
  Tensor z = Tensor::empty({chunk, v}, DType::kFloat32, device);
  Tensor g16 = grad && x.dtype() != DType::kFloat32 ? Tensor::empty({chunk, v}, x.dtype(), device) : Tensor();
  Tensor dw_part = grad && n > chunk ? Tensor::empty({d, v}, DType::kFloat32, device) : Tensor();
  // The rows' double losses (DType has no float64: int64 storage of the same size), their hits, the first bad row.
  Tensor row_loss = Tensor::empty({std::max<int64_t>(n, 1)}, DType::kInt64, device);
  Tensor row_correct = Tensor::empty({std::max<int64_t>(n, 1)}, DType::kInt32, device);
  Tensor bad = Tensor::empty({1}, DType::kInt64, device);
  unsigned long long* bad_row = static_cast<unsigned long long*>(bad.raw());
  check_cuda(cudaMemsetAsync(bad_row, 0xFF, sizeof(unsigned long long)), "cudaMemsetAsync");
  if (grad && n == 0) {  // an empty batch's gradients are zero
    check_cuda(cudaMemsetAsync(dw.raw(), 0, dw.nbytes()), "cudaMemsetAsync");
    if (dbias.defined()) check_cuda(cudaMemsetAsync(dbias.raw(), 0, dbias.nbytes()), "cudaMemsetAsync");
  }
  ChunkRows a{};
  a.z = z.data<float>();
  a.v = v;
  a.labels = labels.raw();
  a.labels64 = labels.dtype() == DType::kInt64;
  a.seed = grad ? seed.data<float>() : nullptr;
  a.n = n;
  a.loss = static_cast<double*>(row_loss.raw());
  a.correct = static_cast<int*>(row_correct.raw());
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t c = std::min(chunk, n - r0);
    const Tensor xc = x.slice(0, r0, r0 + c);
    Tensor zc = z.slice(0, 0, c);
    bmm(xc, w, bias, product(false, false, c, v, d, d, v), zc);  // (c, V) float32 = (c, D) x (D, V) + bias
    a.rows = c;
    a.first = r0;
    rows_kernel<<<static_cast<unsigned>((c + kRowThreads - 1) / kRowThreads), kRowThreads>>>(a, bad_row);
    device::launched("linear_cross_entropy (rows)");
    if (!grad) continue;
    Tensor dx_rows = dx.slice(0, r0, r0 + c);
    chunk_gradients(xc, w, zc, g16, r0 == 0, dx_rows, dw, dw_part, dbias);
  }
  finish_kernel<<<1, 1>>>(static_cast<const double*>(row_loss.raw()), static_cast<const int*>(row_correct.raw()), n,
                          loss.data<float>(), correct.data<float>());
  device::launched("linear_cross_entropy (mean)");
  if (n > 0) record_label_error(bad_row, labels, v, LabelOp::kCrossentropy);
}

void register_linear_cross_entropy_kernels(Kernels& k) { k.set<Op::linear_cross_entropy>(&linear_cross_entropy); }

}  // namespace mixtrain::ops::cuda
