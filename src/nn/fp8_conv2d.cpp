#include "mixtrain/nn/fp8_conv2d.h"

#include "mixtrain/autograd/tape.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/fp8_gemm.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain {

namespace {
float inverse_product(float a, float b) {
  return static_cast<float>(1.0 / (static_cast<double>(a) * static_cast<double>(b)));
}

// The convolutions read the quantized operands as bfloat16 values (every float8 value, and under the block recipe
// every code times its block's power of two, is one), on the bfloat16 GEMM, and give float32 sums, which the scales
// divide before anything is rounded into 16 bits.

// The dtype the convolutions round y and dx into: the bfloat16 operands' own for a bfloat16 x (nullopt), float32 for
// any other x (cast to x's dtype after).
std::optional<DType> output_dtype(const Var& x) {
  return x.dtype() == DType::kBFloat16 ? std::nullopt : std::optional<DType>(DType::kFloat32);
}

// t as (elements / last dimension, last dimension): x as (N H W, cin), the kernel as (kh kw cin, cout).
Tensor as_matrix(const Tensor& t) { return t.reshape({t.numel() / t.dim(-1), t.dim(-1)}); }

// t's copies for the products that read it, t viewed as (elements / last dimension, last dimension): blocks along
// the last dimension (channels) in `rows`, down the leading ones in `columns`; each copy back in t's shape.
Fp8Copies quantize_copies(Fp8TensorScale& scale, const Tensor& t) {
  Fp8Copies c = scale.quantize_copies(as_matrix(t));
  c.rows.values = c.rows.values.reshape(t.shape());
  c.columns.values = c.columns.values.reshape(t.shape());
  return c;
}

// The block recipe's copy of t the forward product reads (x blocked along its channels, the kernel down its rows),
// and the other, which only backward reads, kept as codes with their E8M0 scales (ops::mx_block_encode).
Fp8Quantized block_forward_copy(const Fp8TensorScale& scale, const Tensor& t, bool down) {
  return {ops::mx_block_quantize(as_matrix(t), scale.format(), down).reshape(t.shape()), 1.0f};
}
Fp8SavedOperand block_saved_copy(const Fp8TensorScale& scale, const Tensor& t, bool down) {
  ops::MxBlockCodes c = ops::mx_block_encode(as_matrix(t), scale.format(), down);
  return {std::move(c.codes), 1.0f, std::move(c.scales), down};
}

// The backward pass reads x's copy blocked down (N H W) (dkernel sums over positions) and the kernel's blocked along
// cout (dx sums over output channels); under the per-tensor recipes the forward operands themselves. Kept as FP8
// codes (Fp8SavedOperand; under the block recipe with their blocks' scales), so the layer's input itself is not
// kept.
struct SavedOperands {
  Fp8SavedOperand x;  // (N, H, W, cin)
  Fp8SavedOperand w;  // (kh, kw, cin, cout)
};

void fp8_conv2d_backward(const Var& x, const Var& kernel, const Var& bias, const Var& out,
                         const ops::Conv2dOptions& options, const SavedOperands& s, Fp8GemmScales& scales) {
  const Tensor g = out.grad();  // (N, OH, OW, cout)
  // rows (blocks along cout) for dx, columns (blocks down positions) for dkernel: one tensor unless the recipe blocks.
  const Fp8Copies gq = quantize_copies(scales.grad, g);
  const bool one_copy = gq.rows.values.shares_storage(gq.columns.values);
  const Tensor saved_x = s.x.widened().values.reshape(x.shape());
  const Tensor saved_w = s.w.widened().values.reshape(kernel.shape());
  // dx = (g_q w_q^T) / (s_g s_w), scaled in float32 and rounded once into bfloat16 (float32 for a float32 x).
  const float dx_alpha = inverse_product(gq.rows.scale, s.w.scale);
  const std::optional<DType> dx_dtype = output_dtype(x);
  ops::Conv2dGrads r = ops::conv2d_backward(gq.columns.values, saved_x, saved_w, options,
                                            x.requires_grad() && one_copy, /*need_bias=*/false, dx_dtype, dx_alpha);
  if (x.requires_grad()) {
    // Under the block recipe dx reads the other copy of g: a second pass whose dkernel is not kept.
    Tensor dx = one_copy ? r.dx
                         : ops::conv2d_backward(gq.rows.values, saved_x, saved_w, options, true, false, dx_dtype,
                                                dx_alpha).dx;
    Var(x).accumulate_grad_owned(ops::cast(dx, x.dtype()));
  }
  if (kernel.requires_grad()) {
    ops::scale_in_place(r.dkernel, inverse_product(s.x.scale, gq.columns.scale));
    Var(kernel).accumulate_grad_owned(std::move(r.dkernel));
  }
  if (bias.defined() && bias.requires_grad()) Var(bias).accumulate_grad_owned(ops::sum_rows(g));
}
}  // namespace

Var fp8_conv2d(const Var& x, const Var& kernel, const Var& bias, const ops::Conv2dOptions& options,
               const std::shared_ptr<Fp8GemmScales>& scales) {
  const bool rec = should_record({&x, &kernel, &bias});
  // The forward product sums along x's channels and down the kernel's (kh kw cin) rows.
  SavedOperands s;
  Fp8Quantized xq, wq;
  if (scales->input.recipe() == Fp8Recipe::kBlock) {
    xq = block_forward_copy(scales->input, x.value(), false);
    wq = block_forward_copy(scales->weight, kernel.value(), true);
    if (rec)
      s = {block_saved_copy(scales->input, x.value(), true), block_saved_copy(scales->weight, kernel.value(), false)};
  } else {
    xq = scales->input.quantize(as_matrix(x.value()));
    wq = scales->weight.quantize(as_matrix(kernel.value()));
    if (rec) s = {scales->input.saved(xq), scales->weight.saved(wq)};
    xq.values = xq.values.reshape(x.shape());
    wq.values = wq.values.reshape(kernel.shape());
  }
  // The float32 sums divided by the scales, the bias added, one rounding into bfloat16 (float32 for a float32 x).
  const std::optional<DType> y_dtype = output_dtype(x);
  const Tensor y = ops::conv2d(xq.values, wq.values, bias.defined() ? bias.value() : Tensor(), options, y_dtype,
                               inverse_product(xq.scale, wq.scale));
  Var out(ops::cast(y, x.dtype()), rec);
  if (rec) {
    record_backward(out, [x, kernel, bias, out, options, s = std::move(s), scales]() {
      fp8_conv2d_backward(x, kernel, bias, out, options, s, *scales);
    });
  }
  return out;
}

}  // namespace mixtrain
