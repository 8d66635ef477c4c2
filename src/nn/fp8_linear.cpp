#include "mixtrain/nn/fp8_linear.h"

#include <algorithm>
#include <optional>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/fp8_gemm.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain {

namespace {
// 1 / (a b) in float32, computed in double so that only the final rounding remains.
float inverse_product(float a, float b) {
  return static_cast<float>(1.0 / (static_cast<double>(a) * static_cast<double>(b)));
}

// The leading dimensions of t as one: (..., d) -> (rows, d).
Tensor as_rows(const Tensor& t) { return t.reshape({t.numel() / t.dim(-1), t.dim(-1)}); }

// What the backward pass reads: x's copy blocked down its columns (dW sums over rows) and the kernel's blocked along
// its rows (dx sums over units); under the per-tensor recipes the forward operands themselves. Kept as FP8 codes
// under the per-tensor recipes (Fp8SavedOperand), so the layer's input itself is not kept.
struct SavedOperands {
  Fp8SavedOperand x;  // (rows, in)
  Fp8SavedOperand w;  // (in, units)
};

// Rows of x quantized at once, a multiple of 32 rows (so that the block recipe's blocks down the columns are whole).
// Recording: about 1 MiB of bfloat16 values, but at least 512 rows: each part is one GEMM that packs the whole
// kernel again, which costs as much as the product itself below a few hundred rows. Without gradients (an
// evaluation batch, whose peak is the forward's own) about 128 KiB, at least 128 rows: beside x and y the product
// then holds little more than mixed_bfloat16's, at the price of more, smaller GEMMs (docs/FP8.md).
int64_t row_step(int64_t in, bool keep) {
  const int64_t elements = keep ? int64_t{1} << 19 : int64_t{1} << 16;
  return std::max<int64_t>(keep ? 512 : 128, elements / std::max<int64_t>(in, 1) / 32 * 32);
}

// y (rows, units) = x_q w_q / (s_x s_w) + bias in out_dtype, and what backward keeps when `keep`. x is quantized,
// multiplied and let go a block of rows at a time, so no quantized copy of all of x is held (an evaluation batch
// holds x and y, as under mixed_bfloat16); each row of y is the same product as in one GEMM.
Tensor fp8_product(const Tensor& x_rows, const Tensor& w, const Tensor& bias, Fp8GemmScales& scales, DType out_dtype,
                   bool keep, SavedOperands& saved) {
  // The forward product sums along x's rows and down the kernel's columns; backward reads the kernel's other copy
  // (the block recipe's is kept below as codes with their scales, blocked along its rows).
  const bool block = scales.input.recipe() == Fp8Recipe::kBlock;
  const Fp8Copies wq = keep && !block ? scales.weight.quantize_copies(w)
                                      : Fp8Copies{{Tensor(), 1.0f}, scales.weight.quantize_columns(w)};
  const int64_t rows = x_rows.dim(0), in = x_rows.dim(1);
  const DType format = scales.input.format();
  const float scale = block ? 1.0f : scales.input.scale_for(x_rows);
  record_input_cast(scales, x_rows, scale);  // for the recovery ladder's FP8 rung, when it guards the run
  Tensor y = Tensor::empty({rows, w.dim(1)}, out_dtype, x_rows.device());
  Tensor kept_x = keep ? Tensor::empty({rows, in}, format, x_rows.device()) : Tensor();
  // The block recipe's copy blocked down the columns is kept as codes and one E8M0 scale a block of 32 rows.
  Tensor kept_scales = keep && block ? Tensor::empty({(rows + 31) / 32, in}, DType::kFloat8E8M0FNU, x_rows.device())
                                     : Tensor();
  for (int64_t r0 = 0, step = row_step(in, keep); r0 < rows; r0 += step) {
    const int64_t r1 = std::min(rows, r0 + step);
    const Tensor part = x_rows.slice(0, r0, r1);
    const Fp8Quantized q = block ? Fp8Quantized{ops::mx_block_quantize(part, format, false), 1.0f}
                                 : scales.input.quantize_at(part, scale);
    ops::scaled_matmul(q.values, wq.columns.values, false, false, inverse_product(q.scale, wq.columns.scale), bias,
                       out_dtype, y.slice(0, r0, r1));
    if (!keep) continue;
    Tensor kept_part = kept_x.slice(0, r0, r1);
    if (!block) {
      ops::cast_into(q.values, kept_part);  // the codes: the values convert back exactly
      continue;
    }
    // Parts start on a multiple of 32 rows, so the part's blocks are the whole tensor's.
    const ops::MxBlockCodes c = ops::mx_block_encode(part, format, true);
    kept_part.copy_from(c.codes);
    Tensor kept_part_scales = kept_scales.slice(0, r0 / 32, r0 / 32 + c.scales.dim(0));
    kept_part_scales.copy_from(c.scales);
  }
  if (!keep) return y;
  saved.x = Fp8SavedOperand{kept_x, scale, kept_scales};
  if (!block) {
    saved.w = scales.weight.saved(wq.rows);
    return y;
  }
  ops::MxBlockCodes w_rows = ops::mx_block_encode(w, scales.weight.format(), false);
  saved.w = Fp8SavedOperand{std::move(w_rows.codes), 1.0f, std::move(w_rows.scales), /*blocks_down=*/false};
  return y;
}

// dW (in, units) = x_q^T g_q / (s_x s_g) in float32 (into `into` when defined), a block of x's columns at a time:
// only one block of the saved codes is widened to bfloat16 at once, so the pass holds x's codes and about 256 KiB
// more, not x again in bfloat16. Each element of dW is the same one product over all rows as in one GEMM.
Tensor weight_gradient(const Fp8SavedOperand& x, const Fp8Quantized& g, const Tensor& into) {
  const int64_t rows = x.data.dim(0), in = x.data.dim(1), units = g.values.dim(1);
  Tensor dw = into.defined() ? into : Tensor::empty({in, units}, DType::kFloat32, g.values.device());
  const int64_t step = std::min(in, std::max<int64_t>((int64_t{1} << 19) / std::max<int64_t>(rows, 1) / 32 * 32, 256));
  const float alpha = inverse_product(x.scale, g.scale);
  for (int64_t i0 = 0; i0 < in; i0 += step) {
    const int64_t i1 = std::min(in, i0 + step);
    ops::scaled_matmul(x.columns(i0, i1).widened().values.contiguous(), g.values, true, false, alpha, Tensor(),
                       DType::kFloat32, dw.slice(0, i0, i1));
  }
  return dw;
}

// The gradients of fp8_product from g (rows, units): dx = g_q w_q^T / (s_g s_w) in dx_dtype (when dx_dtype is set),
// dW = x_q^T g_q / (s_x s_g) in float32 (into dw_into when defined, when need_dw).
struct ProductGrads {
  Tensor dx, dw;
};
// dx (rows, in) = g_q w_q^T / s_w in dx_dtype under the block recipe, a block of g's rows at a time: each part's
// copy blocked along its rows is made, multiplied and let go, so the pass holds one part beside g, not a second g.
// Each row of dx is the same product as in one GEMM.
Tensor block_recipe_dx(const Tensor& g, const Fp8Quantized& w, DType format, DType dx_dtype) {
  const int64_t rows = g.dim(0), units = g.dim(1);
  Tensor dx = Tensor::empty({rows, w.values.dim(0)}, dx_dtype, g.device());
  for (int64_t r0 = 0, step = row_step(units, true); r0 < rows; r0 += step) {
    const int64_t r1 = std::min(rows, r0 + step);
    ops::scaled_matmul(ops::mx_block_quantize(g.slice(0, r0, r1), format, false), w.values, false, true,
                       inverse_product(1.0f, w.scale), Tensor(), dx_dtype, dx.slice(0, r0, r1));
  }
  return dx;
}

// g is consumed: its quantized values are written over it.
ProductGrads fp8_product_backward(Tensor g, const SavedOperands& s, Fp8GemmScales& scales,
                                  std::optional<DType> dx_dtype, bool need_dw, const Tensor& dw_into) {
  ProductGrads r;
  if (scales.grad.recipe() == Fp8Recipe::kBlock) {
    if (dx_dtype) r.dx = block_recipe_dx(g, s.w.widened(), scales.grad.format(), *dx_dtype);
    if (need_dw) r.dw = weight_gradient(s.x, scales.grad.quantize_columns_over(g), dw_into);
    return r;
  }
  const Fp8Copies gq = scales.grad.quantize_copies_over(g);  // rows for dx (sums over units), columns for dW (rows)
  if (dx_dtype) {
    const Fp8Quantized w = s.w.widened();
    r.dx = ops::scaled_matmul(gq.rows.values, w.values, false, true, inverse_product(gq.rows.scale, w.scale),
                              Tensor(), *dx_dtype);
  }
  if (need_dw) r.dw = weight_gradient(s.x, gq.columns, dw_into);
  return r;
}

void fp8_linear_backward(const Var& x, const Var& kernel, const Var& bias, const Var& out, const SavedOperands& s,
                         Fp8GemmScales& scales) {
  const Tensor g = as_rows(out.grad());  // (rows, units)
  // dbias: the column sums of the unquantized gradient (Transformer Engine's bgrad), before g is overwritten.
  if (bias.defined() && bias.requires_grad()) Var(bias).accumulate_grad_owned(ops::sum_rows(g));
  // The first gradient goes straight into the kernel's flat buffer where it has one (ParameterArena).
  Tensor into = kernel.requires_grad() ? kernel.fresh_gradient_destination(DType::kFloat32) : Tensor();
  if (into.defined() && !(into.is_contiguous() && into.shape() == kernel.shape())) into = Tensor();
  ProductGrads r = fp8_product_backward(g, s, scales, x.requires_grad() ? std::optional(x.dtype()) : std::nullopt,
                                        kernel.requires_grad(), into);
  if (x.requires_grad()) Var(x).accumulate_grad_owned(r.dx.reshape(x.shape()));
  if (kernel.requires_grad()) Var(kernel).accumulate_grad_owned(std::move(r.dw));
}

// x's shape with its last dimension `units`.
Shape with_units(const Var& x, int64_t units) {
  std::vector<int64_t> dims = x.shape().dims();
  dims.back() = units;
  return Shape(dims);
}
}  // namespace

Var fp8_linear(const Var& x, const Var& kernel, const Var& bias, const std::shared_ptr<Fp8GemmScales>& scales) {
  MIXTRAIN_CHECK(x.value().rank() >= 2 && kernel.value().rank() == 2 && x.shape()[-1] == kernel.shape()[0],
                 "fp8_linear: x " << x.value().describe() << " and kernel " << kernel.value().describe()
                                  << " do not multiply");
  const bool rec = should_record({&x, &kernel, &bias});
  SavedOperands s;
  const Tensor y = fp8_product(as_rows(x.value()), kernel.value(), bias.defined() ? bias.value() : Tensor(), *scales,
                               x.dtype(), rec, s);
  Var out(y.reshape(with_units(x, kernel.shape()[1])), rec);
  if (rec) {
    record_backward(out, [x, kernel, bias, out, s = std::move(s), scales]() {
      fp8_linear_backward(x, kernel, bias, out, s, *scales);
    });
  }
  return out;
}

Tensor kernels_side_by_side(const std::vector<Var>& kernels, int64_t rows) {
  int64_t total = 0;
  for (const Var& k : kernels) total += k.value().numel() / rows;
  Tensor w = Tensor::empty({rows, total}, DType::kFloat32, kernels.at(0).value().device());
  for (size_t i = 0, at = 0; i < kernels.size(); ++i) {
    const int64_t width = kernels[i].value().numel() / rows;
    w.slice(1, at, at + width).copy_from(kernels[i].value().to(DType::kFloat32).reshape({rows, width}));
    at += width;
  }
  return w;
}

Var fp8_fused_projection(const Var& x, const std::vector<Var>& kernels, const std::vector<Var>& biases,
                         const std::shared_ptr<Fp8GemmScales>& scales) {
  MIXTRAIN_CHECK(!kernels.empty() && kernels.size() == biases.size() && x.value().rank() >= 2,
                 "fp8_fused_projection: expected kernels with one bias each (or undefined) and x (..., in), got "
                     << kernels.size() << " kernels, " << biases.size() << " biases and " << x.value().describe());
  const int64_t in = x.shape()[-1];
  std::vector<int64_t> widths;
  int64_t total = 0;
  for (const Var& k : kernels) {
    MIXTRAIN_CHECK(k.dtype() == DType::kFloat32 && k.value().numel() % in == 0 && k.shape()[0] <= in,
                   "fp8_fused_projection: kernel " << k.value().describe() << " does not read " << in << " features");
    widths.push_back(k.value().numel() / in);
    total += widths.back();
  }
  // The float32 kernels side by side in one (in, total) matrix (quantized as one tensor, as Transformer Engine's
  // fused QKV weight), the biases in one float32 vector (a missing one is zero).
  const Tensor w = kernels_side_by_side(kernels, in);
  Tensor b;
  for (size_t i = 0, at = 0; i < kernels.size(); at += widths[i], ++i) {
    if (!biases[i].defined()) continue;
    if (!b.defined()) b = ops::full({total}, DType::kFloat32, 0.0f, x.value().device());
    b.slice(0, at, at + widths[i]).copy_from(biases[i].value().reshape({widths[i]}));
  }
  bool rec = should_record({&x});
  for (size_t i = 0; i < kernels.size(); ++i) rec = rec || should_record({&kernels[i], &biases[i]});
  SavedOperands s;
  const Tensor y = fp8_product(as_rows(x.value()), w, b, *scales, x.dtype(), rec, s);
  Var out(y.reshape(with_units(x, total)), rec);
  if (!rec) return out;
  record_backward(out, [x, kernels, biases, widths, out, s = std::move(s), scales]() {
    const Tensor g = as_rows(out.grad());  // (rows, total)
    const Tensor db = ops::sum_rows(g);  // the unquantized gradient's column sums, as Dense's bias gradient
    ProductGrads r = fp8_product_backward(g, s, *scales, x.requires_grad() ? std::optional(x.dtype()) : std::nullopt,
                                          true, Tensor());
    if (x.requires_grad()) Var(x).accumulate_grad_owned(r.dx.reshape(x.shape()));
    for (size_t i = 0, at = 0; i < kernels.size(); at += widths[i], ++i) {
      if (kernels[i].requires_grad())
        Var(kernels[i]).accumulate_grad_owned(r.dw.slice(1, at, at + widths[i]).contiguous().reshape(kernels[i].shape()));
      if (biases[i].defined() && biases[i].requires_grad())
        Var(biases[i]).accumulate_grad(db.slice(0, at, at + widths[i]).reshape(biases[i].shape()));
    }
  });
  return out;
}

}  // namespace mixtrain
