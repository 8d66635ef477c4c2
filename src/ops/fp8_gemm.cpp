// FP8 GEMM op entries: validation, output allocation, dispatch (kernels in cpu/fp8_gemm.cpp and cuda/fp8_*.cu).
#include "mixtrain/ops/fp8_gemm.h"

#include <cmath>

#include "mixtrain/ops/backend.h"
#include "mixtrain/ops/transfer.h"

namespace mixtrain::ops {

namespace {
void check_operand(const char* op, const Tensor& x) {
  MIXTRAIN_CHECK(x.defined() && is_float(x.dtype()),
                 op << ": expected a float32, float16 or bfloat16 tensor, got "
                    << (x.defined() ? x.describe() : "an undefined tensor"));
}

Tensor amax_scalar(const Device& device) { return Tensor::empty({1}, DType::kFloat32, device); }
}  // namespace

float fp8_amax(const Tensor& x) {
  check_operand("fp8_amax", x);
  const Device device = common_device("fp8_amax", {&x});
  Tensor amax = amax_scalar(device);
  if (x.numel() == 0) return 0.0f;
  kernel_for<Op::fp8_amax>(device)(x.contiguous(), amax);
  return read_scalar(amax);  // on a GPU, a copy to the host
}

namespace {
// `into` checked for a quantization of x, or a new bfloat16 tensor of x's shape.
Tensor values_tensor(const char* op, const Tensor& x, const Tensor& into, const Device& device) {
  if (!into.defined()) return Tensor::empty(x.shape(), DType::kBFloat16, device);
  MIXTRAIN_CHECK(into.dtype() == DType::kBFloat16 && into.shape() == x.shape() && into.is_contiguous() &&
                     into.device() == device && (!into.shares_storage(x) ||
                      (into.starts_with(x) && x.is_contiguous() && x.dtype() == DType::kBFloat16)),
                 op << ": the output must be a contiguous bfloat16 tensor of x's shape (or x itself), got "
                    << into.describe() << " for x " << x.describe());
  return into;
}
}  // namespace

Fp8Operand fp8_quantize(const Tensor& x, DType format, float scale, std::optional<Float8Overflow> overflow,
                        const Tensor& into) {
  check_operand("fp8_quantize", x);
  MIXTRAIN_CHECK(format == DType::kFloat8E4M3FN || format == DType::kFloat8E5M2,
                 "fp8_quantize: the format must be float8_e4m3fn or float8_e5m2, got " << dtype_name(format));
  MIXTRAIN_CHECK(std::isfinite(scale) && scale > 0.0f,
                 "fp8_quantize: the scale must be finite and positive, got " << scale);
  const Device device = common_device("fp8_quantize", {&x});
  Fp8Operand q{values_tensor("fp8_quantize", x, into, device), 0.0f};
  if (x.numel() == 0) return q;
  Tensor amax = amax_scalar(device);
  const Float8Overflow o = overflow.value_or(format == DType::kFloat8E5M2 ? Float8Overflow::kNonSaturating
                                                                          : Float8Overflow::kSaturate);
  kernel_for<Op::fp8_quantize>(device)(x.contiguous(), format, scale, o, q.values, amax);
  q.amax = read_scalar(amax);
  return q;
}

Tensor mx_block_quantize(const Tensor& x, DType format, bool along_columns, const Tensor& into) {
  check_operand("mx_block_quantize", x);
  MIXTRAIN_CHECK(x.rank() == 2, "mx_block_quantize: expected a matrix, got " << x.describe());
  MIXTRAIN_CHECK(format == DType::kFloat8E4M3FN || format == DType::kFloat8E5M2,
                 "mx_block_quantize: the format must be float8_e4m3fn or float8_e5m2, got " << dtype_name(format));
  const Device device = common_device("mx_block_quantize", {&x});
  Tensor values = values_tensor("mx_block_quantize", x, into, device);
  if (x.numel() > 0) kernel_for<Op::mx_block_quantize>(device)(x.contiguous(), format, along_columns, values);
  return values;
}

namespace {
void check_mx_format(const char* op, DType format) {
  MIXTRAIN_CHECK(format == DType::kFloat8E4M3FN || format == DType::kFloat8E5M2,
                 op << ": the format must be float8_e4m3fn or float8_e5m2, got " << dtype_name(format));
}

// The block scales' shape for (rows, cols): block order as a row-major matrix.
Shape mx_scales_shape(int64_t rows, int64_t cols, bool along_columns) {
  return along_columns ? Shape{(rows + 31) / 32, cols} : Shape{rows, (cols + 31) / 32};
}
}  // namespace

MxBlockCodes mx_block_encode(const Tensor& x, DType format, bool along_columns) {
  check_operand("mx_block_encode", x);
  MIXTRAIN_CHECK(x.rank() == 2, "mx_block_encode: expected a matrix, got " << x.describe());
  check_mx_format("mx_block_encode", format);
  const Device device = common_device("mx_block_encode", {&x});
  MxBlockCodes q{Tensor::empty(x.shape(), format, device),
                 Tensor::empty(mx_scales_shape(x.dim(0), x.dim(1), along_columns), DType::kFloat8E8M0FNU, device),
                 along_columns};
  if (x.numel() > 0) kernel_for<Op::mx_block_encode>(device)(x.contiguous(), format, along_columns, q.codes, q.scales);
  return q;
}

Tensor mx_block_decode(const MxBlockCodes& q, const Tensor& into) {
  MIXTRAIN_CHECK(q.codes.defined() && q.codes.rank() == 2 && q.scales.defined(),
                 "mx_block_decode: expected a matrix of codes and its block scales");
  check_mx_format("mx_block_decode", q.codes.dtype());
  const Shape want = mx_scales_shape(q.codes.dim(0), q.codes.dim(1), q.along_columns);
  MIXTRAIN_CHECK(q.scales.dtype() == DType::kFloat8E8M0FNU && q.scales.shape() == want,
                 "mx_block_decode: the scales of " << q.codes.describe()
                     << (q.along_columns ? " down its columns" : " along its rows")
                     << " must be float8_e8m0fnu of shape " << want << ", got " << q.scales.describe());
  const Device device = common_device("mx_block_decode", {&q.codes, &q.scales});
  Tensor values = values_tensor("mx_block_decode", q.codes, into, device);
  if (q.codes.numel() > 0)
    kernel_for<Op::mx_block_decode>(device)(q.codes.contiguous(), q.scales.contiguous(), q.along_columns, values);
  return values;
}

Tensor scaled_matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, float alpha, const Tensor& bias,
                     DType out_dtype, const Tensor& c_into) {
  check_operand("scaled_matmul", a);
  check_operand("scaled_matmul", b);
  MIXTRAIN_CHECK(a.rank() == 2 && b.rank() == 2 && a.dtype() == b.dtype(),
                 "scaled_matmul: expected two matrices of one dtype, got " << a.describe() << " and " << b.describe());
  kernel::ScaledMatmulLayout l{trans_a, trans_b, a.dim(trans_a ? 1 : 0), b.dim(trans_b ? 0 : 1),
                               a.dim(trans_a ? 0 : 1)};
  MIXTRAIN_CHECK(b.dim(trans_b ? 1 : 0) == l.k, "scaled_matmul: inner dimensions differ: " << a.describe()
                                                    << (trans_a ? " (transposed)" : "") << " x " << b.describe()
                                                    << (trans_b ? " (transposed)" : ""));
  MIXTRAIN_CHECK(std::isfinite(alpha), "scaled_matmul: alpha must be finite, got " << alpha);
  MIXTRAIN_CHECK(is_float(out_dtype), "scaled_matmul: the output dtype must be floating, got " << dtype_name(out_dtype));
  MIXTRAIN_CHECK(!bias.defined() || (bias.dtype() == DType::kFloat32 && bias.shape() == Shape({l.n})),
                 "scaled_matmul: the bias must be float32 (" << l.n << ",), got " << bias.describe());
  const Device device = common_device("scaled_matmul", {&a, &b});
  Tensor c = c_into;
  if (c.defined()) {
    MIXTRAIN_CHECK(c.is_contiguous() && c.dtype() == out_dtype && c.shape() == Shape({l.m, l.n}),
                   "scaled_matmul: the output must be contiguous " << dtype_name(out_dtype) << " (" << l.m << ", "
                                                                   << l.n << "), got " << c.describe());
  } else {
    c = Tensor::empty({l.m, l.n}, out_dtype, device);
  }
  const Tensor bc = bias.defined() ? bias.contiguous() : Tensor();
  if (c.numel() > 0) kernel_for<Op::scaled_matmul>(device)(a.contiguous(), b.contiguous(), bc, l, alpha, c);
  return c;
}

}  // namespace mixtrain::ops
