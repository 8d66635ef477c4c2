// CPU kernel of linear_cross_entropy: per chunk of rows, the GEMM writes the chunk's float32 logits (bias in its
// epilogue), each row is reduced to its loss and arg-max (log-sum-exp in float32, as the cross-entropy kernel's
// rows) and, with a seed, rewritten in place into its dlogits, from which two more GEMMs give the chunk's rows of dx
// and add its share of dw; dbias adds the chunk's columns. Rows run in parallel, but every sum runs in row order,
// so the bits do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "mixtrain/kernels/gemm.h"
#include "mixtrain/ops/linear_cross_entropy.h"
#include "cpu_backend.h"

namespace mixtrain::ops::cpu {

namespace {

constexpr int64_t kParallelRows = 4;  // a chunk this small runs its rows on one thread

// The row's loss -log softmax(z)[label] and whether its first arg-max is the label; with grad, z becomes
// k * (softmax(z) - onehot(label)) in place (the cross-entropy backward's row, k = seed / rows).
struct RowResult {
  double loss;
  bool correct;
};

RowResult reduce_row(float* z, int64_t v, int64_t label, bool grad, float k) {
  float mx = -INFINITY;
  int64_t arg = 0;
  for (int64_t j = 0; j < v; ++j) {
    if (z[j] > z[arg]) arg = j;  // the first maximum, as the accuracy kernel's std::max_element
    mx = std::max(mx, z[j]);
  }
  float s = 0;
  for (int64_t j = 0; j < v; ++j) s += std::exp(z[j] - mx);
  const float lse = mx + std::log(s);
  const RowResult r{-static_cast<double>(z[label] - lse), arg == label};
  if (grad)
    for (int64_t j = 0; j < v; ++j) z[j] = k * (std::exp(z[j] - lse) * 1.0f - (j == label ? 1.0f : 0.0f));
  return r;
}

// The operands as the chunk loop reads them.
struct Operands {
  DType dtype;  // x's and w's
  const char* x;
  const void* w;
  const float* bias;
  std::vector<int64_t> labels;
  int64_t n, d, v;
  size_t elem;
};

// One chunk of rows [r0, r0 + c): its rows' results into loss / correct (row order), and with grad its dlogits,
// its rows of dx, and its share of dw and dbias (first: this chunk writes them rather than adds).
void run_chunk(const Operands& o, int64_t r0, int64_t c, bool grad, float k, bool first, Tensor& z, Tensor& g16,
               std::vector<double>& loss, std::vector<char>& correct, Tensor& dx, Tensor& dw, Tensor& dbias) {
  float* zp = z.data<float>();
  const char* xc = o.x + static_cast<size_t>(r0 * o.d) * o.elem;
  kernels::gemm(false, false, c, o.v, o.d, o.dtype, xc, o.d, o.w, o.v, DType::kFloat32, zp, o.v, false, o.bias);
#pragma omp parallel for schedule(static) if (c >= kParallelRows)
  for (int64_t i = 0; i < c; ++i) {
    const RowResult r = reduce_row(zp + i * o.v, o.v, o.labels[static_cast<size_t>(r0 + i)], grad, k);
    loss[static_cast<size_t>(r0 + i)] = r.loss;
    correct[static_cast<size_t>(r0 + i)] = r.correct;
  }
  if (!grad) return;
  // dlogits in the operands' dtype, as linear_backward casts its dy before its products.
  const void* g = zp;
  if (o.dtype != DType::kFloat32) {
    convert_elements(zp, DType::kFloat32, g16.raw(), o.dtype, c * o.v);
    g = g16.raw();
  }
  char* dxc = static_cast<char*>(dx.raw()) + static_cast<size_t>(r0 * o.d) * o.elem;
  kernels::gemm(false, true, c, o.d, o.v, o.dtype, g, o.v, o.w, o.v, o.dtype, dxc, o.d, false, nullptr);  // (c, D)
  kernels::gemm(true, false, o.d, o.v, c, o.dtype, xc, o.d, g, o.v, DType::kFloat32, dw.data<float>(), o.v, !first,
                nullptr);  // (D, V) += (D, c) x (c, V)
  if (!dbias.defined()) return;
  float* db = dbias.data<float>();
#pragma omp parallel for schedule(static) if (o.v >= 1024)
  for (int64_t j = 0; j < o.v; ++j) {
    float s = first ? 0.0f : db[j];
    for (int64_t i = 0; i < c; ++i) s += zp[i * o.v + j];  // float32 dlogits, row order
    db[j] = s;
  }
}

void linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& labels,
                          const Tensor& seed, int64_t chunk_rows, Tensor& loss, Tensor& correct, Tensor& dx,
                          Tensor& dw, Tensor& dbias) {
  // The labels' memory is read through raw(), as every kernel reads its operands (a device the CPU kernels stand in
  // for holds them in host memory too).
  std::vector<int64_t> ids(static_cast<size_t>(labels.numel()));
  convert_elements(labels.raw(), labels.dtype(), ids.data(), DType::kInt64, labels.numel());
  Operands o{x.dtype(), static_cast<const char*>(x.raw()), w.raw(), bias.defined() ? bias.data<float>() : nullptr,
             std::move(ids), x.dim(0), x.dim(1), w.dim(1), dtype_size(x.dtype())};
  const bool grad = seed.defined();
  const float k = grad ? seed.data<float>()[0] / static_cast<float>(std::max<int64_t>(o.n, 1)) : 0.0f;
  const int64_t chunk = std::min(chunk_rows, std::max<int64_t>(o.n, 1));
  // The chunk's buffers come from the device's allocator, so its live and peak counts show them.
  Tensor z = Tensor::empty({chunk, o.v}, DType::kFloat32, x.device());
  Tensor g16 = grad && o.dtype != DType::kFloat32 ? Tensor::empty({chunk, o.v}, o.dtype, x.device()) : Tensor();
  std::vector<double> row_loss(static_cast<size_t>(o.n));
  std::vector<char> row_correct(static_cast<size_t>(o.n));
  if (grad && o.n == 0) {  // an empty batch's gradients are zero
    std::fill_n(dw.data<float>(), dw.numel(), 0.0f);
    if (dbias.defined()) std::fill_n(dbias.data<float>(), dbias.numel(), 0.0f);
  }
  for (int64_t r0 = 0; r0 < o.n; r0 += chunk)
    run_chunk(o, r0, std::min(chunk, o.n - r0), grad, k, r0 == 0, z, g16, row_loss, row_correct, dx, dw, dbias);
  double total = 0;
  int64_t hits = 0;
  for (int64_t i = 0; i < o.n; ++i) {
    total += row_loss[static_cast<size_t>(i)];
    hits += row_correct[static_cast<size_t>(i)];
  }
  loss.data<float>()[0] = static_cast<float>(o.n ? total / static_cast<double>(o.n) : 0.0);
  correct.data<float>()[0] = static_cast<float>(hits);
}

}  // namespace

void register_linear_cross_entropy_kernels(Kernels& k) { k.set<Op::linear_cross_entropy>(&linear_cross_entropy); }

}  // namespace mixtrain::ops::cpu
