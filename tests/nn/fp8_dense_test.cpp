// Dense under the float8 policies against an independent reference: each operand quantized by the format's definition
// (tests/core/float8_reference.h: the code nearest to x * scale, the scale the recipe's formula gives), the product
// of the quantized values in float64, divided by the scales. Also: the delayed recipe's history and what the layer
// keeps for its backward pass.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../ops/mx_block_reference.h"
#include "fp8_reference.h"
#include "mixtrain/autograd/tape.h"
#include "mixtrain/core/allocator.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/ops/fp8_gemm.h"

namespace mixtrain {
namespace {

namespace ref = float8_reference;
using fp8_test::quantize_ref;
using fp8_test::RefOperand;

class Fp8DenseTest : public ::testing::Test {
 protected:
  void TearDown() override {
    set_global_policy("float32");
    set_fp8_recipe(Fp8Recipe::kDelayed);
  }
};

// c (m, n) = a (m, k) b (k, n) / (sa sb) in float64, and sum |a b| / (sa sb) for the tolerance; trans_* read the
// stored matrix transposed.
struct RefProduct {
  std::vector<double> c, abs_sum;
};
RefProduct product_ref(const RefOperand& a, const RefOperand& b, int64_t m, int64_t k, int64_t n, bool ta, bool tb) {
  RefProduct p{std::vector<double>(m * n), std::vector<double>(m * n)};
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t t = 0; t < k; ++t) {
        const double v = a.q[ta ? t * m + i : i * k + t] * b.q[tb ? j * k + t : t * n + j] / (a.scale * b.scale);
        p.c[i * n + j] += v;
        p.abs_sum[i * n + j] += std::fabs(v);
      }
  return p;
}

// Tolerance of one result: the float32 sum of k exact products (k 2^-24 of sum |a b|), the float32 scaling and bias
// (2 2^-24 more), and the final rounding into the output's dtype (2^-8 |c| in bfloat16, 2^-24 in float32).
double tolerance(double abs_sum, double value, int64_t k, double out_unit) {
  return (k + 2) * 0x1p-24 * abs_sum + out_unit * std::fabs(value) + 1e-30;
}

void run_forward_backward(const char* policy, const ref::Format& grad_format, float grad_max) {
  set_fp8_recipe(Fp8Recipe::kCurrent);
  const int64_t m = 7, k = 33, n = 17;
  Dense d(n, "linear", dtype_arg(policy));
  Rng rng(3);
  d.build({k}, rng);
  Rng values(4);
  std::vector<float> xv(m * k);
  for (float& v : xv) v = values.uniform(-3, 3);
  Var x(Tensor::from_floats({m, k}, xv, DType::kBFloat16), /*requires_grad=*/true);
  std::vector<float> cv(m * n);
  for (float& c : cv) c = values.uniform(-1, 1) * 1e-3f;
  const Tensor c = Tensor::from_floats({m, n}, cv, DType::kBFloat16);
  Var y = d(x);
  ASSERT_EQ(y.dtype(), DType::kBFloat16);
  backward(sum(multiply(y, Var(c))));  // dy = c, exactly (c * 1 in bfloat16)

  const RefOperand qx = quantize_ref(x.value().to_floats(), ref::kE4M3, 448.0f);
  const RefOperand qw = quantize_ref(d.kernel().value().to_floats(), ref::kE4M3, 448.0f);
  const RefOperand qg = quantize_ref(c.to_floats(), grad_format, grad_max);
  const RefProduct fy = product_ref(qx, qw, m, k, n, false, false);
  const std::vector<float> got_y = y.value().to_floats(), bias = d.bias().value().to_floats();
  for (int64_t i = 0; i < m * n; ++i) {
    const double want = fy.c[i] + bias[i % n];
    ASSERT_NEAR(got_y[i], want, tolerance(fy.abs_sum[i] + std::fabs(bias[i % n]), want, k, 0x1p-8)) << policy << i;
  }
  const RefProduct fdx = product_ref(qg, qw, m, n, k, false, true);
  const std::vector<float> got_dx = x.grad().to_floats();
  for (int64_t i = 0; i < m * k; ++i)
    ASSERT_NEAR(got_dx[i], fdx.c[i], tolerance(fdx.abs_sum[i], fdx.c[i], n, 0x1p-8)) << policy << " dx " << i;
  const RefProduct fdw = product_ref(qx, qg, k, m, n, true, false);
  const std::vector<float> got_dw = d.kernel().grad().to_floats();
  ASSERT_EQ(d.kernel().grad().dtype(), DType::kFloat32);
  for (int64_t i = 0; i < k * n; ++i)
    ASSERT_NEAR(got_dw[i], fdw.c[i], tolerance(fdw.abs_sum[i], fdw.c[i], m, 0x1p-24)) << policy << " dw " << i;
  const std::vector<float> got_db = d.bias().grad().to_floats(), cb = c.to_floats();
  for (int64_t j = 0; j < n; ++j) {
    double s = 0, abs_s = 0;
    for (int64_t i = 0; i < m; ++i) s += cb[i * n + j], abs_s += std::fabs(cb[i * n + j]);
    ASSERT_NEAR(got_db[j], s, (m + 1) * 0x1p-24 * abs_s) << "the bias gradient sums the unquantized gradient";
  }
}

TEST_F(Fp8DenseTest, MixedFloat8EqualsQuantizedFloat64Products) {
  run_forward_backward("mixed_float8", ref::kE5M2, 57344.0f);
}

TEST_F(Fp8DenseTest, MixedFloat8E4m3QuantizesTheGradientToE4m3) {
  run_forward_backward("mixed_float8_e4m3", ref::kE4M3, 448.0f);
}

// The quantization is visible: a product under mixed_float8 differs from mixed_bfloat16's (so the tests above would
// fail if the layer fell back to the bfloat16 product).
TEST_F(Fp8DenseTest, DiffersFromTheBfloat16Product) {
  Dense a(5, "linear", dtype_arg("mixed_float8")), b(5, "linear", dtype_arg("mixed_bfloat16"));
  Rng r1(9), r2(9);
  a.build({40}, r1);
  b.build({40}, r2);
  Rng values(5);
  std::vector<float> xv(3 * 40);
  for (float& v : xv) v = values.uniform(-1, 1);
  const Var x(Tensor::from_floats({3, 40}, xv));
  NoGradGuard ng;
  EXPECT_NE(a(x).value().to_floats(), b(x).value().to_floats());
}

// Delayed scaling: the first step casts with scale 1 and records the amaxes; on_optimizer_update rolls the history
// once, after which the scale is format max / the recorded amax.
TEST_F(Fp8DenseTest, DelayedScalingUsesTheHistoryRolledPerUpdate) {
  set_fp8_recipe(Fp8Recipe::kDelayed);
  Dense d(4, "relu", dtype_arg("mixed_float8"));
  Rng rng(6);
  d.build({8}, rng);
  Var x(Tensor::from_floats({2, 8}, std::vector<float>(16, 0.25f)));
  backward(sum(cast(d(x), DType::kFloat32)));
  backward(sum(cast(d(x), DType::kFloat32)));  // a second micro-batch: the same slot
  const Fp8GemmScales* s = d.fp8_scales();
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->input.delayed().scale(), 1.0f);
  EXPECT_EQ(s->input.delayed().history().back(), 0.25f);
  d.on_optimizer_update();
  EXPECT_EQ(s->input.delayed().scale(), 448.0f / 0.25f);
  const std::vector<float> h = s->input.delayed().history();
  EXPECT_EQ(h.back(), 0.0f);
  EXPECT_EQ(h[h.size() - 2], 0.25f);
  EXPECT_GT(s->grad.delayed().scale(), 1.0f) << "the gradient's amax was recorded in the backward pass";
}

// The block recipe (MXFP8): each product reads its operands blocked along its own reduction dimension, each copy
// from the high-precision tensor (mx_block_reference.h, by the definition): y = x (along rows) w (down columns),
// dx = dy (along rows) w^T (w along rows), dW = x^T (x down columns) dy (down columns); no per-tensor scale.
// m = 40 rows make a full and a short block down the columns, k = 45 and n = 33 along the rows; the inputs span
// 2^-6 .. 2^3 so that blocks get different scales.
TEST_F(Fp8DenseTest, BlockRecipeEqualsTheDequantizedFloat64Products) {
  using mx_test::mx_dequantized;
  set_fp8_recipe(Fp8Recipe::kBlock);
  const int64_t m = 40, k = 45, n = 33;
  Dense d(n, "linear", dtype_arg("mixed_float8"));
  Rng rng(3);
  d.build({k}, rng);
  Rng values(4);
  std::vector<float> xv(m * k), cv(m * n);
  for (float& v : xv) v = std::ldexp(values.uniform(-1, 1), static_cast<int>(values.uniform(-6, 4)));
  for (float& c : cv) c = values.uniform(-1, 1) * 1e-3f;
  Var x(Tensor::from_floats({m, k}, xv, DType::kBFloat16), /*requires_grad=*/true);
  const Tensor c = Tensor::from_floats({m, n}, cv, DType::kBFloat16);
  Var y = d(x);
  backward(sum(multiply(y, Var(c))));  // dy = c
  EXPECT_TRUE(d.fp8_layer_scales()->state(d.dtype_policy()).empty()) << "the block recipe carries no state";

  const std::vector<float> xs = x.value().to_floats(), ws = d.kernel().value().to_floats(), gs = c.to_floats();
  const RefOperand x_rows{mx_dequantized(xs, m, k, ref::kE4M3, 448.0, false), 1.0};
  const RefOperand x_cols{mx_dequantized(xs, m, k, ref::kE4M3, 448.0, true), 1.0};
  const RefOperand w_cols{mx_dequantized(ws, k, n, ref::kE4M3, 448.0, true), 1.0};
  const RefOperand w_rows{mx_dequantized(ws, k, n, ref::kE4M3, 448.0, false), 1.0};
  const RefOperand g_rows{mx_dequantized(gs, m, n, ref::kE5M2, 57344.0, false), 1.0};
  const RefOperand g_cols{mx_dequantized(gs, m, n, ref::kE5M2, 57344.0, true), 1.0};
  const RefProduct fy = product_ref(x_rows, w_cols, m, k, n, false, false);
  const std::vector<float> got_y = y.value().to_floats(), bias = d.bias().value().to_floats();
  for (int64_t i = 0; i < m * n; ++i) {
    const double want = fy.c[i] + bias[i % n];
    ASSERT_NEAR(got_y[i], want, tolerance(fy.abs_sum[i] + std::fabs(bias[i % n]), want, k, 0x1p-8)) << "y " << i;
  }
  const RefProduct fdx = product_ref(g_rows, w_rows, m, n, k, false, true);
  const std::vector<float> got_dx = x.grad().to_floats();
  for (int64_t i = 0; i < m * k; ++i)
    ASSERT_NEAR(got_dx[i], fdx.c[i], tolerance(fdx.abs_sum[i], fdx.c[i], n, 0x1p-8)) << "dx " << i;
  const RefProduct fdw = product_ref(x_cols, g_cols, k, m, n, true, false);
  const std::vector<float> got_dw = d.kernel().grad().to_floats();
  for (int64_t i = 0; i < k * n; ++i)
    ASSERT_NEAR(got_dw[i], fdw.c[i], tolerance(fdw.abs_sum[i], fdw.c[i], m, 0x1p-24)) << "dw " << i;
}

// Per-tensor quantization is not what the block recipe computes: the same layer under the current recipe gives
// another y (so the test above would fail if the recipe fell back to one scale per tensor).
TEST_F(Fp8DenseTest, BlockRecipeDiffersFromPerTensorScaling) {
  std::vector<float> xv(4 * 64);
  Rng values(12);
  for (float& v : xv) v = std::ldexp(values.uniform(-1, 1), static_cast<int>(values.uniform(-6, 4)));
  const Var x(Tensor::from_floats({4, 64}, xv));
  std::vector<std::vector<float>> outs;
  for (Fp8Recipe r : {Fp8Recipe::kBlock, Fp8Recipe::kCurrent}) {
    set_fp8_recipe(r);
    Dense d(8, "linear", dtype_arg("mixed_float8"));
    Rng rng(9);
    d.build({64}, rng);
    NoGradGuard ng;
    outs.push_back(d(x).value().to_floats());
  }
  EXPECT_NE(outs[0], outs[1]);
}

// What one Dense keeps for its backward pass, in allocator bytes: its output and the saved operands, x and the
// kernel as FP8 codes (1 byte an element; under the block recipe with one E8M0 scale a block of 32, down x's columns
// and along the kernel's rows, as the backward products read them), so the layer's bfloat16 input need not be kept.
// The gradients computed with x's value let go of equal, bit for bit, those of the same step that kept it.
struct KeptStep {
  int64_t held_bytes;
  std::vector<float> dx, dw;
};
KeptStep step_keeping(Fp8Recipe recipe, bool release_input) {
  set_fp8_recipe(recipe);
  const int64_t m = 48, k = 96, n = 40;
  Dense d(n, "gelu", dtype_arg("mixed_float8"));
  Rng rng(5);
  d.build({k}, rng);
  Rng values(6);
  std::vector<float> xv(m * k), cv(m * n);
  for (float& v : xv) v = values.uniform(-4, 4);
  for (float& c : cv) c = values.uniform(-1, 1);
  Var x(Tensor::from_floats({m, k}, xv, DType::kBFloat16), /*requires_grad=*/true);
  const int64_t before = memory_stats().live_bytes;
  Var y = d(x);
  KeptStep r;
  if (release_input) x.release_value();
  // gelu keeps its input, the product's (m, n) bfloat16 output, beside its own output y.
  r.held_bytes = memory_stats().live_bytes - before + (release_input ? m * k * 2 : 0);
  EXPECT_TRUE(!release_input || !x.value().defined());
  backward(sum(multiply(y, Var(Tensor::from_floats({m, n}, cv, DType::kBFloat16)))));
  r.dx = x.grad().to_floats();
  r.dw = d.kernel().grad().to_floats();
  return r;
}

TEST_F(Fp8DenseTest, KeepsItsInputAndKernelAsFp8CodesForTheBackwardPass) {
  const int64_t m = 48, k = 96, n = 40;
  const int64_t outputs = 2 * (m * n * 2);  // the product's output (read by gelu) and y, bfloat16
  for (Fp8Recipe recipe : {Fp8Recipe::kDelayed, Fp8Recipe::kCurrent, Fp8Recipe::kBlock}) {
    const bool block = recipe == Fp8Recipe::kBlock;
    const int64_t x_bytes = m * k + (block ? (m + 31) / 32 * k : 0);  // codes, and the block scales
    const int64_t w_bytes = k * n + (block ? k * ((n + 31) / 32) : 0);  // codes, and the block scales
    const KeptStep kept = step_keeping(recipe, false), released = step_keeping(recipe, true);
    EXPECT_EQ(released.held_bytes, outputs + x_bytes + w_bytes) << fp8_recipe_name(recipe);
    EXPECT_EQ(kept.held_bytes, released.held_bytes) << fp8_recipe_name(recipe);
    EXPECT_EQ(released.dx, kept.dx) << fp8_recipe_name(recipe);
    EXPECT_EQ(released.dw, kept.dw) << fp8_recipe_name(recipe);
  }
}

// x (m, k): values uniform in [-4, 4) from Rng(seed), in bfloat16, recorded.
Var uniform_bfloat16_input(int64_t m, int64_t k, uint64_t seed) {
  Rng values(seed);
  std::vector<float> xv(m * k);
  for (float& v : xv) v = values.uniform(-4, 4);
  return Var(Tensor::from_floats({m, k}, xv, DType::kBFloat16), /*requires_grad=*/true);
}

// A call of d on x without gradients: the allocator's peak above what was held before it, what it left held (its
// output), and the output's values.
struct NoGradCall {
  int64_t peak, held;
  std::vector<float> values;
};
NoGradCall call_without_gradients(Dense& d, const Var& x) {
  NoGradGuard ng;
  reset_peak_memory();
  const int64_t before = memory_stats().live_bytes;
  const Var y = d(x);
  return {memory_stats().peak_bytes - before, memory_stats().live_bytes - before, y.value().to_floats()};
}

// Without gradients the activation goes over the product's own output: the layer's output holds the bits the
// recorded call computes, and the call's peak is the product's alone (as with a linear activation), where applying
// the activation as its own op held the product and the activation's output at once (2 m n bfloat16 values: more
// than the product's own peak at this shape, whose quantized input is cut into parts of 512 rows).
TEST_F(Fp8DenseTest, WithoutGradientsTheActivationOverwritesTheProduct) {
  const int64_t m = 4096, k = 1024, n = 512;
  const Var x = uniform_bfloat16_input(m, k, 6);
  for (Fp8Recipe recipe : {Fp8Recipe::kCurrent, Fp8Recipe::kBlock}) {
    set_fp8_recipe(recipe);
    Dense linear(n, "linear", dtype_arg("mixed_float8"));
    Rng rng(5);
    linear.build({k}, rng);
    const NoGradCall product = call_without_gradients(linear, x);
    EXPECT_EQ(product.held, m * n * 2) << "only the bfloat16 output stays";
    for (const char* act : {"gelu", "relu"}) {
      Dense d(n, act, dtype_arg("mixed_float8"));
      Rng same(5);
      d.build({k}, same);
      const std::vector<float> recorded = d(x).value().to_floats();
      const NoGradCall call = call_without_gradients(d, x);
      EXPECT_EQ(call.held, m * n * 2) << "only the bfloat16 output stays";
      EXPECT_EQ(call.peak, product.peak) << act << " " << fp8_recipe_name(recipe);
      EXPECT_EQ(call.values, recorded) << act << " " << fp8_recipe_name(recipe);
    }
  }
}

// Without gradients x is quantized a part of about 128 KiB (at least 128 rows) at a time, not 1 MiB: beside x and y
// the product holds the widened kernel and one part, where mixed_bfloat16's holds its kernel's bfloat16 copy. The
// allocator's peak above what was held before the call, both policies on the same shapes, the same bits as the
// recorded call (which quantizes parts of 1024 rows here).
TEST_F(Fp8DenseTest, WithoutGradientsThePeakIsBfloat16sAndOnePart) {
  const int64_t m = 4096, k = 512, n = 128;
  const Var x = uniform_bfloat16_input(m, k, 7);
  Dense bf16(n, "linear", dtype_arg("mixed_bfloat16"));
  Rng rng(5);
  bf16.build({k}, rng);
  const int64_t bf16_peak = call_without_gradients(bf16, x).peak;
  const int64_t part = 128 * k * 2 + 16;  // 128 rows of bfloat16 values, and the amax scalars
  for (Fp8Recipe recipe : {Fp8Recipe::kDelayed, Fp8Recipe::kCurrent, Fp8Recipe::kBlock}) {
    set_fp8_recipe(recipe);
    Dense d(n, "linear", dtype_arg("mixed_float8"));
    Rng same(5);
    d.build({k}, same);
    const std::vector<float> recorded = d(x).value().to_floats();
    const NoGradCall call = call_without_gradients(d, x);
    EXPECT_LE(call.peak, bf16_peak + part) << fp8_recipe_name(recipe);
    EXPECT_EQ(call.values, recorded) << fp8_recipe_name(recipe);
  }
}

// The backward pass's peak above what it starts with, and dx, for dy = g.
struct BackwardPass {
  int64_t peak;
  Tensor dx;
};
BackwardPass backward_of(Fp8Recipe recipe, const Var& x_in, const Tensor& g) {
  set_fp8_recipe(recipe);
  Dense d(g.dim(1), "linear", dtype_arg("mixed_float8"));
  Rng rng(5);
  d.build({x_in.shape()[1]}, rng);
  Var x(x_in.value(), /*requires_grad=*/true);
  Var loss = sum(multiply(d(x), Var(g)));  // dy = g
  reset_peak_memory();
  const int64_t before = memory_stats().live_bytes;
  backward(loss);
  return {memory_stats().peak_bytes - before, x.grad()};
}

// Under the block recipe dx = g w^T reads g's copy blocked along its rows: it is made a part of rows at a time (1024
// rows here, 1 MiB), so the backward pass holds at most one part more than the delayed recipe's, which quantizes g
// over itself (measured: the same peak), where it held a whole second g (4 MiB; the peak was 2.4 MB above the
// delayed recipe's); the copy blocked down the columns for dW is written over g. dx has the bits of one product of
// the whole copy.
TEST_F(Fp8DenseTest, UnderTheBlockRecipeBackwardHoldsOnePartOfTheGradientsRowCopy) {
  const int64_t m = 4096, k = 128, n = 512;
  const Var x = uniform_bfloat16_input(m, k, 8);
  std::vector<float> gv(m * n);
  Rng values(9);
  for (float& v : gv) v = values.uniform(-1, 1) * 1e-3f;
  const Tensor g = Tensor::from_floats({m, n}, gv, DType::kBFloat16);
  const BackwardPass delayed = backward_of(Fp8Recipe::kDelayed, x, g), block = backward_of(Fp8Recipe::kBlock, x, g);
  const int64_t part = 1024 * n * 2;
  EXPECT_LE(block.peak, delayed.peak + part) << "block " << block.peak << ", delayed " << delayed.peak;
  Dense d(n, "linear", dtype_arg("mixed_float8"));
  Rng rng(5);
  d.build({k}, rng);
  const Tensor whole = ops::scaled_matmul(ops::mx_block_quantize(g, DType::kFloat8E5M2, false),
                                          ops::mx_block_quantize(d.kernel().value(), DType::kFloat8E4M3FN, false),
                                          false, true, 1.0f, Tensor(), DType::kBFloat16);
  EXPECT_EQ(block.dx.to_floats(), whole.to_floats());
}

TEST_F(Fp8DenseTest, TheRecipeNamesParse) {
  EXPECT_EQ(parse_fp8_recipe("delayed"), Fp8Recipe::kDelayed);
  EXPECT_EQ(parse_fp8_recipe("current"), Fp8Recipe::kCurrent);
  EXPECT_EQ(parse_fp8_recipe("block"), Fp8Recipe::kBlock);
  EXPECT_STREQ(fp8_recipe_name(Fp8Recipe::kBlock), "block");
  EXPECT_THROW(parse_fp8_recipe("mxfp8"), Error);
  EXPECT_THROW(parse_fp8_recipe("blocks"), Error);
  // One scale per tensor is meaningless under the block recipe: asking for it is refused.
  Fp8TensorScale block(DType::kFloat8E4M3FN, Fp8Recipe::kBlock);
  EXPECT_THROW(block.quantize(Tensor::from_floats({2, 2}, {1, 2, 3, 4})), Error);
  EXPECT_EQ(fp8_recipe(), Fp8Recipe::kDelayed) << "delayed is the default, as in Transformer Engine";
}

}  // namespace
}  // namespace mixtrain
