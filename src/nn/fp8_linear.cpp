#include "mixtrain/nn/fp8_linear.h"

#include "mixtrain/autograd/tape.h"
#include "mixtrain/ops/fp8_gemm.h"
#include "mixtrain/ops/reduce.h"

namespace mixtrain {

namespace {
// 1 / (a b) in float32, computed in double so that only the final rounding remains.
float inverse_product(float a, float b) {
  return static_cast<float>(1.0 / (static_cast<double>(a) * static_cast<double>(b)));
}

// The leading dimensions of t as one: (..., d) -> (rows, d).
Tensor as_rows(const Tensor& t) { return t.reshape({t.numel() / t.dim(-1), t.dim(-1)}); }

// What the backward pass reads: x's copy blocked down its columns (dW sums over rows) and the kernel's blocked along
// its rows (dx sums over units); under the per-tensor recipes the forward operands themselves.
struct SavedOperands {
  Fp8Quantized x;  // (rows, in)
  Fp8Quantized w;  // (in, units)
};

void fp8_linear_backward(const Var& x, const Var& kernel, const Var& bias, const Var& out, const SavedOperands& s,
                         Fp8GemmScales& scales) {
  const Tensor g = as_rows(out.grad());  // (rows, units)
  const Fp8Copies gq = scales.grad.quantize_copies(g);  // rows for dx (sums over units), columns for dW (over rows)
  if (x.requires_grad()) {
    Tensor dx = ops::scaled_matmul(gq.rows.values, s.w.values, false, true, inverse_product(gq.rows.scale, s.w.scale),
                                   Tensor(), x.dtype());
    Var(x).accumulate_grad_owned(dx.reshape(x.shape()));
  }
  if (kernel.requires_grad()) {
    // The first gradient goes straight into the kernel's flat buffer where it has one (ParameterArena).
    Tensor into = kernel.fresh_gradient_destination(DType::kFloat32);
    if (into.defined() && !(into.is_contiguous() && into.shape() == kernel.shape())) into = Tensor();
    Tensor dw = ops::scaled_matmul(s.x.values, gq.columns.values, true, false,
                                   inverse_product(s.x.scale, gq.columns.scale), Tensor(), DType::kFloat32, into);
    Var(kernel).accumulate_grad_owned(std::move(dw));
  }
  if (bias.defined() && bias.requires_grad()) Var(bias).accumulate_grad_owned(ops::reduce_sum(g, 0, false, DType::kFloat32));
}
}  // namespace

void require_fp8_on_cpu(const std::string& layer, const DTypePolicy& policy, const Tensor& x) {
  MIXTRAIN_CHECK(x.device().is_cpu(), layer << ": the policy " << policy.name() << " runs on the CPU only so far, got "
                                            << x.describe() << " (docs/FP8.md); use mixed_bfloat16 on a GPU");
}

Var fp8_linear(const Var& x, const Var& kernel, const Var& bias, const std::shared_ptr<Fp8GemmScales>& scales) {
  MIXTRAIN_CHECK(x.value().rank() >= 2 && kernel.value().rank() == 2 && x.shape()[-1] == kernel.shape()[0],
                 "fp8_linear: x " << x.value().describe() << " and kernel " << kernel.value().describe()
                                  << " do not multiply");
  const bool rec = should_record({&x, &kernel, &bias});
  // The forward product sums along x's rows and down the kernel's columns.
  const Tensor x_rows = as_rows(x.value());
  const Fp8Copies xq = scales->input.quantize_copies(x_rows);
  record_input_cast(*scales, x_rows, xq.rows);
  const Fp8Copies wq = scales->weight.quantize_copies(kernel.value());
  SavedOperands s{xq.columns, wq.rows};
  std::vector<int64_t> dims = x.shape().dims();
  dims.back() = kernel.shape()[1];
  const Tensor y = ops::scaled_matmul(xq.rows.values, wq.columns.values, false, false,
                                      inverse_product(xq.rows.scale, wq.columns.scale),
                                      bias.defined() ? bias.value() : Tensor(), x.dtype());
  Var out(y.reshape(Shape(dims)), rec);
  if (rec) {
    record_backward(out, [x, kernel, bias, out, s = std::move(s), scales]() {
      fp8_linear_backward(x, kernel, bias, out, s, *scales);
    });
  }
  return out;
}

}  // namespace mixtrain
