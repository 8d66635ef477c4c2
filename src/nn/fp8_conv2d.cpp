#include "mixtrain/nn/fp8_conv2d.h"

#include "mixtrain/autograd/tape.h"
#include "mixtrain/ops/elementwise.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain {

namespace {
float inverse_product(float a, float b) {
  return static_cast<float>(1.0 / (static_cast<double>(a) * static_cast<double>(b)));
}

// The quantized operand's values in float32 (exact: every float8 value is a float32 value).
Tensor widened(const Fp8Quantized& q) { return ops::cast(q.values, DType::kFloat32); }

struct SavedOperands {
  Fp8Quantized x;  // (N, H, W, cin), bfloat16 values
  Fp8Quantized w;  // (kh, kw, cin, cout)
};

void fp8_conv2d_backward(const Var& x, const Var& kernel, const Var& bias, const Var& out,
                         const ops::Conv2dOptions& options, const SavedOperands& s, Fp8GemmScales& scales) {
  const Tensor g = out.grad();  // (N, OH, OW, cout)
  const Fp8Quantized gq = scales.grad.quantize(g);
  ops::Conv2dGrads r = ops::conv2d_backward(widened(gq), widened(s.x), widened(s.w), options, x.requires_grad(),
                                            /*need_bias=*/false);
  if (x.requires_grad()) {
    ops::scale_in_place(r.dx, inverse_product(gq.scale, s.w.scale));
    Var(x).accumulate_grad_owned(ops::cast(r.dx, x.dtype()));
  }
  if (kernel.requires_grad()) {
    ops::scale_in_place(r.dkernel, inverse_product(s.x.scale, gq.scale));
    Var(kernel).accumulate_grad_owned(std::move(r.dkernel));
  }
  if (bias.defined() && bias.requires_grad()) Var(bias).accumulate_grad_owned(ops::sum_rows(g));
}
}  // namespace

Var fp8_conv2d(const Var& x, const Var& kernel, const Var& bias, const ops::Conv2dOptions& options,
               const std::shared_ptr<Fp8GemmScales>& scales) {
  const bool rec = should_record({&x, &kernel, &bias});
  SavedOperands s{scales->input.quantize(x.value()), scales->weight.quantize(kernel.value())};
  Tensor y = ops::conv2d(widened(s.x), widened(s.w), Tensor(), options);  // float32 sums
  ops::scale_in_place(y, inverse_product(s.x.scale, s.w.scale));
  if (bias.defined()) y = ops::bias_add(y, bias.value());
  Var out(ops::cast(y, x.dtype()), rec);
  if (rec) {
    record_backward(out, [x, kernel, bias, out, options, s = std::move(s), scales]() {
      fp8_conv2d_backward(x, kernel, bias, out, options, s, *scales);
    });
  }
  return out;
}

}  // namespace mixtrain
