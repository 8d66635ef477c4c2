#include "mixtrain/ops/matmul.h"


#include "mixtrain/kernels/gemm.h"
#include "mixtrain/ops/elementwise.h"

namespace mixtrain::ops {

namespace {
void check_matrix(const Tensor& t, const char* what, const char* op) {
  MIXTRAIN_CHECK(t.defined() && t.rank() == 2, op << ": " << what << " must be a 2-D tensor, got " << t.describe());
  MIXTRAIN_CHECK(is_float(t.dtype()), op << ": " << what << " must be floating, got " << t.describe());
}
}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, std::optional<DType> out_dtype) {
  check_matrix(a, "a", "matmul");
  check_matrix(b, "b", "matmul");
  MIXTRAIN_CHECK(a.dtype() == b.dtype(), "matmul: operands differ in dtype: " << a.describe() << " and " << b.describe());
  const int64_t m = trans_a ? a.dim(1) : a.dim(0);
  const int64_t k = trans_a ? a.dim(0) : a.dim(1);
  const int64_t kb = trans_b ? b.dim(1) : b.dim(0);
  const int64_t n = trans_b ? b.dim(0) : b.dim(1);
  MIXTRAIN_CHECK(k == kb, "matmul: inner dimensions differ: " << a.describe() << (trans_a ? "^T" : "") << " x "
                                                              << b.describe() << (trans_b ? "^T" : ""));
  Tensor c = Tensor::empty({m, n}, out_dtype.value_or(a.dtype()));
  kernels::gemm(trans_a, trans_b, m, n, k, a.dtype(), a.raw(), a.dim(1), b.raw(), b.dim(1), c.dtype(), c.raw(), n,
                /*accumulate=*/false, /*bias=*/nullptr);
  return c;
}

MatmulGrads matmul_backward(const Tensor& dc, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                            bool need_a, bool need_b) {
  MatmulGrads g;
  // c = A B with A = op(a), B = op(b):  dA = dc B^T,  dB = A^T dc; transposing back gives da, db.
  if (need_a) {
    g.da = trans_a ? matmul(b, dc, trans_b, true, a.dtype())    // da = (dc B^T)^T = B dc^T
                   : matmul(dc, b, false, !trans_b, a.dtype());  // da = dc B^T
  }
  if (need_b) {
    g.db = trans_b ? matmul(dc, a, true, trans_a, b.dtype())     // db = (A^T dc)^T = dc^T A
                   : matmul(a, dc, !trans_a, false, b.dtype());  // db = A^T dc
  }
  return g;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  check_matrix(x, "input", "linear");
  check_matrix(w, "kernel", "linear");
  MIXTRAIN_CHECK(x.dtype() == w.dtype(), "linear: input " << x.describe() << " and kernel " << w.describe()
                                                          << " must share the compute dtype");
  MIXTRAIN_CHECK(x.dim(1) == w.dim(0),
                 "linear: input " << x.describe() << " has " << x.dim(1) << " features, kernel expects " << w.dim(0));
  if (bias.defined())
    MIXTRAIN_CHECK(bias.dtype() == DType::kFloat32 && bias.numel() == w.dim(1),
                   "linear: bias must be float32 (" << w.dim(1) << ",), got " << bias.describe());
  Tensor y = Tensor::empty({x.dim(0), w.dim(1)}, x.dtype());
  kernels::gemm(false, false, x.dim(0), w.dim(1), x.dim(1), x.dtype(), x.raw(), x.dim(1), w.raw(), w.dim(1),
                y.dtype(), y.raw(), w.dim(1), false, bias.defined() ? bias.data<float>() : nullptr);
  return y;
}

LinearGrads linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, bool need_x, bool need_bias) {
  MIXTRAIN_CHECK(dy.rank() == 2 && dy.dim(0) == x.dim(0) && dy.dim(1) == w.dim(1),
                 "linear_backward: gradient " << dy.describe() << " does not match output (" << x.dim(0) << ", "
                                              << w.dim(1) << ")");
  Tensor dyc = dy.to(x.dtype());
  LinearGrads g;
  if (need_x) g.dx = matmul(dyc, w, false, true, x.dtype());       // (B, out) x (out, in)
  g.dw = matmul(x, dyc, true, false, DType::kFloat32);             // (in, B) x (B, out), float32 out
  if (need_bias) g.dbias = sum_rows(dyc);  // float32 sums
  return g;
}

}  // namespace mixtrain::ops
