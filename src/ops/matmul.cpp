// Matrix product entries: validation, layout of strided operands, output allocation, dispatch
// (the CPU kernels, in cpu/matmul.cpp and cpu/linear_activation.cpp, call kernels::gemm per product).
#include "mixtrain/ops/matmul.h"
#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/dtype_check.h"

#include <algorithm>

#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/reduce.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain::ops {

namespace {

void check_operand(const Tensor& t, const char* what, const char* op) {
  MIXTRAIN_CHECK(t.defined() && t.rank() >= 2,
                 op << ": " << what << " must have at least 2 dimensions, got "
                    << (t.defined() ? t.describe() : std::string("an undefined tensor")));
  MIXTRAIN_CHECK(is_float(t.dtype()), op << ": " << what << " must be floating, got " << t.describe());
}

// How kernels::gemm reads the last two dimensions of t in place: as a row-major (rows, cols) matrix with
// row stride ld, or (transposed) as the row-major (cols, rows) matrix it is a transpose view of.
// False when neither describes t (then a contiguous copy is read).
bool in_place_layout(const Tensor& t, int64_t* ld, bool* transposed) {
  const int64_t rows = t.dim(-2), cols = t.dim(-1);
  const int64_t sr = t.strides()[static_cast<size_t>(t.rank() - 2)];
  const int64_t sc = t.strides()[static_cast<size_t>(t.rank() - 1)];
  // A dimension of length 1 has no meaningful stride.
  const int64_t row_ld = rows <= 1 ? std::max<int64_t>(cols, 1) : sr;
  if ((cols <= 1 || sc == 1) && row_ld >= std::max<int64_t>(cols, 1)) {
    *ld = row_ld;
    *transposed = false;
    return true;
  }
  const int64_t col_ld = cols <= 1 ? std::max<int64_t>(rows, 1) : sc;
  if ((rows <= 1 || sr == 1) && col_ld >= std::max<int64_t>(rows, 1)) {
    *ld = col_ld;
    *transposed = true;
    return true;
  }
  return false;
}

// The operand as the kernel reads it: t itself, or a contiguous copy; trans is flipped for a transposed view.
Tensor prepare_operand(const Tensor& t, bool* trans, int64_t* ld) {
  bool transposed = false;
  if (in_place_layout(t, ld, &transposed)) {
    if (transposed) *trans = !*trans;
    return t;
  }
  *ld = std::max<int64_t>(t.dim(-1), 1);
  return t.contiguous();
}

std::string operand_text(const Tensor& t, bool trans) { return t.describe() + (trans ? "^T" : ""); }

// A product checked and laid out for a kernel: the operands as it reads them (in place or copied), the contiguous
// bias, the layout, the device and the result's dimensions.
struct Planned {
  Tensor a, b, bias;
  kernel::BmmLayout layout;
  Device device;
  std::vector<int64_t> dims;  // (batch..., m, n)
};

// The checks and layout shared by bmm, matmul, linear and linear_activation.
Planned plan_product(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, DType out_dtype,
                     const Tensor& bias, const char* op) {
  check_operand(a, "a", op);
  check_operand(b, "b", op);
  check_same_dtype(op, "operand a", a, "operand b", b);
  MIXTRAIN_CHECK(is_float(out_dtype), op << ": the output dtype must be floating, got " << dtype_name(out_dtype));
  const int64_t m = trans_a ? a.dim(-1) : a.dim(-2);
  const int64_t k = trans_a ? a.dim(-2) : a.dim(-1);
  const int64_t kb = trans_b ? b.dim(-1) : b.dim(-2);
  const int64_t n = trans_b ? b.dim(-2) : b.dim(-1);
  MIXTRAIN_CHECK(k == kb, op << ": inner dimensions differ: " << operand_text(a, trans_a) << " x "
                             << operand_text(b, trans_b));
  if (bias.defined())
    MIXTRAIN_CHECK(bias.dtype() == DType::kFloat32 && bias.rank() == 1 && bias.dim(0) == n,
                   op << ": bias must be float32 (" << n << ",), got " << bias.describe());
  const Device device = common_device(op, {&a, &b, &bias});

  kernel::BmmLayout l;
  l.m = m, l.n = n, l.k = k;
  l.trans_a = trans_a, l.trans_b = trans_b;
  Tensor ar = prepare_operand(a, &l.trans_a, &l.lda);
  Tensor br = prepare_operand(b, &l.trans_b, &l.ldb);

  // Batch dimensions, aligned from the right; a missing or length-1 dimension broadcasts (stride 0).
  const int batch_rank = std::max(a.rank(), b.rank()) - 2;
  l.batch.assign(static_cast<size_t>(batch_rank), 1);
  l.a_batch_strides.assign(static_cast<size_t>(batch_rank), 0);
  l.b_batch_strides.assign(static_cast<size_t>(batch_rank), 0);
  for (int d = 0; d < batch_rank; ++d) {
    const int da = d - (batch_rank - (a.rank() - 2)), db = d - (batch_rank - (b.rank() - 2));
    const int64_t na = da >= 0 ? a.dim(da) : 1, nb = db >= 0 ? b.dim(db) : 1;
    MIXTRAIN_CHECK(na == nb || na == 1 || nb == 1,
                   op << ": batch dimensions do not broadcast: " << a.describe() << " x " << b.describe());
    const size_t i = static_cast<size_t>(d);
    l.batch[i] = na == 1 ? nb : na;
    if (na != 1) l.a_batch_strides[i] = ar.strides()[static_cast<size_t>(da)];
    if (nb != 1) l.b_batch_strides[i] = br.strides()[static_cast<size_t>(db)];
  }
  std::vector<int64_t> dims = l.batch;
  dims.push_back(m);
  dims.push_back(n);
  return Planned{std::move(ar), std::move(br), bias.defined() ? bias.contiguous() : Tensor(), std::move(l), device,
                 std::move(dims)};
}

// The shared path of bmm, matmul and linear.
// `into`, when defined, receives the result in place (it must be contiguous, of the result's shape and dtype).
Tensor product(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, DType out_dtype, const Tensor& bias,
               const char* op, const Tensor& into = Tensor()) {
  const Planned p = plan_product(a, b, trans_a, trans_b, out_dtype, bias, op);
  Tensor c;
  if (into.defined()) {
    MIXTRAIN_CHECK(into.shape() == Shape(p.dims) && into.dtype() == out_dtype && into.is_contiguous() &&
                       into.device() == p.device,
                   op << ": the output tensor " << into.describe() << " does not fit the product "
                      << dtype_name(out_dtype) << " " << Shape(p.dims) << " (needs it contiguous, on "
                      << p.device.str() << ")");
    c = into;
  } else {
    c = Tensor::empty(Shape(p.dims), out_dtype, p.device);
  }
  kernel_for<Op::bmm>(p.device)(p.a, p.b, p.bias, p.layout, c);
  return c;
}

// x (..., in) and w (in, out) as linear and linear_activation take them.
void check_linear(const Tensor& x, const Tensor& w, const char* op) {
  MIXTRAIN_CHECK(x.defined() && x.rank() >= 1 && is_float(x.dtype()),
                 op << ": input must be a floating tensor (..., in), got "
                    << (x.defined() ? x.describe() : std::string("an undefined tensor")));
  MIXTRAIN_CHECK(w.defined() && w.rank() == 2 && is_float(w.dtype()),
                 op << ": kernel must be a floating (in, out) tensor, got "
                    << (w.defined() ? w.describe() : std::string("an undefined tensor")));
  check_same_dtype(op, "input", x, "kernel", w);
  MIXTRAIN_CHECK(x.dim(-1) == w.dim(0),
                 op << ": input " << x.describe() << " has " << x.dim(-1) << " features, kernel expects " << w.dim(0));
}

// linear's output shape: x's with the last dimension w's columns.
Shape linear_shape(const Tensor& x, const Tensor& w) {
  std::vector<int64_t> dims = x.shape().dims();
  dims.back() = w.dim(1);
  return Shape(dims);
}

// Whether operand x has the batch dimensions of the product's gradient g (it was not broadcast).
bool same_batch(const Tensor& x, const Tensor& g) {
  if (x.rank() != g.rank()) return false;
  for (int d = 0; d < x.rank() - 2; ++d)
    if (x.dim(d) != g.dim(d)) return false;
  return true;
}

// Sums g (batch..., rows, cols) over the batch dimensions that were broadcast to reach it from like's
// shape, and rounds once into like's dtype.
Tensor reduce_to(const Tensor& g, const Tensor& like) {
  if (g.shape() == like.shape()) return cast(g, like.dtype());
  Tensor s = g;
  const int extra = g.rank() - like.rank();
  for (int d = 0; d < g.rank() - 2; ++d) {
    const int dl = d - extra;
    if (dl < 0 || (like.dim(dl) == 1 && g.dim(d) != 1)) s = reduce_sum(s, d, /*keepdims=*/true, DType::kFloat32);
  }
  return cast(s.reshape(like.shape()), like.dtype());
}

}  // namespace

Tensor bmm(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, std::optional<DType> out_dtype) {
  return product(a, b, trans_a, trans_b, out_dtype.value_or(a.dtype()), Tensor(), "bmm");
}

BmmGrads bmm_backward(const Tensor& dc, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, bool need_a,
                      bool need_b) {
  check_operand(a, "a", "bmm_backward");
  check_operand(b, "b", "bmm_backward");
  MIXTRAIN_CHECK(dc.defined() && is_float(dc.dtype()) && dc.rank() >= 2,
                 "bmm_backward: the gradient must be a floating tensor of rank >= 2, got "
                     << (dc.defined() ? dc.describe() : std::string("an undefined tensor")));
  const Tensor g = cast(dc, a.dtype());
  BmmGrads out;
  // c = A B with A = op(a), B = op(b):  dA = dc B^T,  dB = A^T dc; transposing back gives da, db.
  // A broadcast operand's gradient is kept in float32 until its batch sum.
  if (need_a) {
    const DType dt = same_batch(a, g) ? a.dtype() : DType::kFloat32;
    Tensor da = trans_a ? bmm(b, g, trans_b, true, dt)     // da = (dc B^T)^T = B dc^T
                        : bmm(g, b, false, !trans_b, dt);  // da = dc B^T
    out.da = reduce_to(da, a);
  }
  if (need_b) {
    const DType dt = same_batch(b, g) ? b.dtype() : DType::kFloat32;
    Tensor db = trans_b ? bmm(g, a, true, trans_a, dt)     // db = (A^T dc)^T = dc^T A
                        : bmm(a, g, !trans_a, false, dt);  // db = A^T dc
    out.db = reduce_to(db, b);
  }
  return out;
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, std::optional<DType> out_dtype) {
  return product(a, b, trans_a, trans_b, out_dtype.value_or(a.dtype()), Tensor(), "matmul");
}

MatmulGrads matmul_backward(const Tensor& dc, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                            bool need_a, bool need_b) {
  return bmm_backward(dc, a, b, trans_a, trans_b, need_a, need_b);
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  check_linear(x, w, "linear");
  Tensor y = product(x.reshape({-1, x.dim(-1)}), w, false, false, x.dtype(), bias, "linear");  // (B, out)
  return y.reshape(linear_shape(x, w));
}

LinearGrads linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, bool need_x, bool need_bias,
                            const Tensor& dw_into) {
  std::vector<int64_t> out_dims = x.shape().dims();
  if (!out_dims.empty()) out_dims.back() = w.dim(1);
  MIXTRAIN_CHECK(dy.defined() && dy.shape() == Shape(out_dims),
                 "linear_backward: gradient " << (dy.defined() ? dy.describe() : std::string("(undefined)"))
                                              << " does not match output " << Shape(out_dims));
  const int64_t in = x.dim(-1), out = w.dim(1);
  Tensor dy2 = cast(dy, x.dtype()).reshape({-1, out});  // (B, out)
  Tensor x2 = x.reshape({-1, in});                   // (B, in)
  LinearGrads g;
  if (need_x) g.dx = matmul(dy2, w, false, true, x.dtype()).reshape(x.shape());  // (B, out) x (out, in)
  // (in, B) x (B, out), float32 out
  g.dw = product(x2, dy2, true, false, DType::kFloat32, Tensor(), "linear_backward", dw_into);
  if (need_bias) g.dbias = sum_rows(dy2);                                        // float32 sums
  return g;
}

LinearActivation linear_activation(const Tensor& x, const Tensor& w, const Tensor& bias, Activation act,
                                   bool keep_pre_activation) {
  const char* op = "linear_activation";
  check_linear(x, w, op);
  const Device device = common_device(op, {&x, &w, &bias});
  const bool fused = (act == Activation::kRelu || act == Activation::kGelu) &&
                     supports<Op::linear_activation>(device.type);
  if (!fused) {
    Tensor z = linear(x, w, bias);
    return {activation(z, act), keep_pre_activation ? z : Tensor()};
  }
  // The product exactly as linear() lays it out, so the GEMM reads the same operands the same way.
  const Planned p = plan_product(x.reshape({-1, x.dim(-1)}), w, false, false, x.dtype(), bias, op);  // (B, out)
  Tensor y = Tensor::empty(Shape(p.dims), x.dtype(), p.device);
  Tensor pre = keep_pre_activation ? Tensor::empty(Shape(p.dims), x.dtype(), p.device) : Tensor();
  kernel_for<Op::linear_activation>(p.device)(p.a, p.b, p.bias, p.layout, act, y, pre);
  const Shape shape = linear_shape(x, w);
  return {y.reshape(shape), keep_pre_activation ? pre.reshape(shape) : Tensor()};
}

LinearGrads linear_activation_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& y,
                                       const Tensor& pre_activation, Activation act, bool need_x, bool need_bias,
                                       const Tensor& dw_into) {
  if (act == Activation::kGelu && !pre_activation.defined())
    MIXTRAIN_FAIL(kInvalidInput, "linear_activation_backward: gelu's derivative needs the pre-activation",
                  "run linear_activation with keep_pre_activation = true when its gradient will be needed");
  // Where relu reads its input, y gives the same bits (see the header); so do the other activations' reads.
  const Tensor& input = pre_activation.defined() ? pre_activation : y;
  return linear_backward(activation_backward(dy, input, y, act), x, w, need_x, need_bias, dw_into);
}

}  // namespace mixtrain::ops
