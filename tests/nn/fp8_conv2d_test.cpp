// Conv2D under mixed_float8 against an independent reference: the operands quantized by the format's definition
// (fp8_reference.h), the convolution and its gradients computed from the quantized values in float64, divided by the
// scales; odd shapes, valid and same padding, stride 1 and 2.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../ops/mx_block_reference.h"
#include "fp8_reference.h"
#include "mixtrain/autograd/tape.h"
#include "mixtrain/core/allocator.h"
#include "mixtrain/nn/conv_layers.h"

namespace mixtrain {
namespace {

namespace ref = float8_reference;
using fp8_test::quantize_ref;
using fp8_test::RefOperand;

struct Geometry {
  int64_t n, h, w, cin, cout, k, stride;
  bool same;
};

// The reference convolution's index map: for output (oh, ow) and tap (i, j), the input row and column, or -1 outside.
struct Taps {
  ops::Axis ah, aw;
  int64_t row(int64_t oh, int64_t i) const {
    const int64_t r = oh * ah.stride + i - ah.pad_before;
    return r >= 0 && r < ah.in ? r : -1;
  }
  int64_t col(int64_t ow, int64_t j) const {
    const int64_t c = ow * aw.stride + j - aw.pad_before;
    return c >= 0 && c < aw.in ? c : -1;
  }
};

// Tolerance: float32 sums of exact products (terms 2^-24 of sum |terms| each), float32 scaling and bias, and the
// final rounding (2^-8 |value| in bfloat16, 2^-24 in float32).
double tolerance(double abs_sum, double value, int64_t terms, double out_unit) {
  return (terms + 2) * 0x1p-24 * abs_sum + out_unit * std::fabs(value) + 1e-30;
}

// The quantized operands of each product and their scales. Per-tensor recipes: one copy of each tensor. The block
// recipe: x blocked along its channels for y and down its (N H W) positions for dkernel, the kernel as
// (kh kw cin, cout) down its rows for y and along cout for dx, dy along cout for dx and down its positions for
// dkernel, all with scale 1.
struct ConvOperands {
  std::vector<double> x_y, w_y, g_dx, w_dx, x_dw, g_dw;
  double sxw = 1, sgw = 1, sxg = 1;
};

ConvOperands reference_operands(bool block, const std::vector<float>& x, const std::vector<float>& w,
                                const std::vector<float>& dy, int64_t cin, int64_t cout) {
  if (!block) {
    const RefOperand qx = quantize_ref(x, ref::kE4M3, 448.0f), qw = quantize_ref(w, ref::kE4M3, 448.0f);
    const RefOperand qg = quantize_ref(dy, ref::kE5M2, 57344.0f);
    return {qx.q, qw.q, qg.q, qw.q, qx.q, qg.q, qx.scale * qw.scale, qg.scale * qw.scale, qx.scale * qg.scale};
  }
  const int64_t xr = static_cast<int64_t>(x.size()) / cin, wr = static_cast<int64_t>(w.size()) / cout;
  const int64_t gr = static_cast<int64_t>(dy.size()) / cout;
  using mx_test::mx_dequantized;
  return {mx_dequantized(x, xr, cin, ref::kE4M3, 448.0, false),
          mx_dequantized(w, wr, cout, ref::kE4M3, 448.0, true),
          mx_dequantized(dy, gr, cout, ref::kE5M2, 57344.0, false),
          mx_dequantized(w, wr, cout, ref::kE4M3, 448.0, false),
          mx_dequantized(x, xr, cin, ref::kE4M3, 448.0, true),
          mx_dequantized(dy, gr, cout, ref::kE5M2, 57344.0, true)};
}

void check_conv(const Geometry& g, Fp8Recipe recipe = Fp8Recipe::kCurrent) {
  set_fp8_recipe(recipe);
  Conv2D conv(g.cout, g.k, g.stride, g.same ? "same" : "valid", "linear", true, dtype_arg("mixed_float8"));
  Rng rng(7), values(8);
  conv.build({g.h, g.w, g.cin}, rng);
  std::vector<float> xv(g.n * g.h * g.w * g.cin), bv(g.cout);
  for (float& v : xv) v = values.uniform(-2, 2);
  if (recipe == Fp8Recipe::kBlock)
    for (float& v : xv) v = std::ldexp(v, static_cast<int>(values.uniform(-5, 3)));
  for (float& v : bv) v = values.uniform(-1, 1);
  Var(conv.bias()).mutable_value().copy_from(Tensor::from_floats({g.cout}, bv));
  Var x(Tensor::from_floats({g.n, g.h, g.w, g.cin}, xv, DType::kBFloat16), true);
  Var y = conv(x);
  const Taps t{ops::window_axis(g.h, g.k, g.stride, g.same ? ops::Padding::kSame : ops::Padding::kValid, "test"),
               ops::window_axis(g.w, g.k, g.stride, g.same ? ops::Padding::kSame : ops::Padding::kValid, "test")};
  const int64_t oh = t.ah.out, ow = t.aw.out;
  ASSERT_EQ(y.shape(), Shape({g.n, oh, ow, g.cout}));
  std::vector<float> cv(y.value().numel());
  for (float& c : cv) c = values.uniform(-1, 1) * 1e-2f;
  const Tensor c = Tensor::from_floats(y.shape(), cv, DType::kBFloat16);
  backward(sum(multiply(y, Var(c))));  // dy = c

  const ConvOperands o = reference_operands(recipe == Fp8Recipe::kBlock, x.value().to_floats(),
                                            conv.kernel().value().to_floats(), c.to_floats(), g.cin, g.cout);
  const double sxw = o.sxw, sgw = o.sgw, sxg = o.sxg;
  auto xi = [&](int64_t n, int64_t r, int64_t col, int64_t ci) { return ((n * g.h + r) * g.w + col) * g.cin + ci; };
  auto wi = [&](int64_t i, int64_t j, int64_t ci, int64_t co) { return ((i * g.k + j) * g.cin + ci) * g.cout + co; };
  auto yi = [&](int64_t n, int64_t a, int64_t b, int64_t co) { return ((n * oh + a) * ow + b) * g.cout + co; };
  std::vector<double> ry(cv.size()), ay(cv.size()), rdx(xv.size()), adx(xv.size());
  std::vector<double> rdw(o.w_y.size()), adw(o.w_y.size());
  std::vector<int> ndx(xv.size());
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t a = 0; a < oh; ++a)
      for (int64_t b = 0; b < ow; ++b)
        for (int64_t i = 0; i < g.k; ++i)
          for (int64_t j = 0; j < g.k; ++j) {
            const int64_t r = t.row(a, i), col = t.col(b, j);
            if (r < 0 || col < 0) continue;
            for (int64_t ci = 0; ci < g.cin; ++ci)
              for (int64_t co = 0; co < g.cout; ++co) {
                const int64_t ex = xi(n, r, col, ci), ew = wi(i, j, ci, co), ey = yi(n, a, b, co);
                const double py = o.x_y[ex] * o.w_y[ew] / sxw, pdx = o.g_dx[ey] * o.w_dx[ew] / sgw;
                const double pdw = o.x_dw[ex] * o.g_dw[ey] / sxg;
                ry[ey] += py, ay[ey] += std::fabs(py);
                rdx[ex] += pdx, adx[ex] += std::fabs(pdx);
                ++ndx[ex];
                rdw[ew] += pdw, adw[ew] += std::fabs(pdw);
              }
          }
  const int64_t taps = g.k * g.k * g.cin;
  const std::vector<float> gy = y.value().to_floats(), gdx = x.grad().to_floats(), gdw = conv.kernel().grad().to_floats();
  for (size_t e = 0; e < gy.size(); ++e) {
    const double want = ry[e] + bv[e % g.cout];
    ASSERT_NEAR(gy[e], want, tolerance(ay[e] + std::fabs(bv[e % g.cout]), want, taps, 0x1p-8)) << "y " << e;
  }
  for (size_t e = 0; e < gdx.size(); ++e)
    ASSERT_NEAR(gdx[e], rdx[e], tolerance(adx[e], rdx[e], ndx[e], 0x1p-8)) << "dx " << e;
  for (size_t e = 0; e < gdw.size(); ++e)
    ASSERT_NEAR(gdw[e], rdw[e], tolerance(adw[e], rdw[e], g.n * oh * ow, 0x1p-24)) << "dkernel " << e;
  const std::vector<float> gdb = conv.bias().grad().to_floats(), cb = c.to_floats();
  for (int64_t co = 0; co < g.cout; ++co) {
    double s = 0, a = 0;
    for (size_t e = co; e < cb.size(); e += g.cout) s += cb[e], a += std::fabs(cb[e]);
    ASSERT_NEAR(gdb[co], s, (cb.size() / g.cout + 1) * 0x1p-24 * a) << "the bias gradient sums the unquantized dy";
  }
}

class Fp8Conv2DTest : public ::testing::Test {
 protected:
  void TearDown() override {
    set_global_policy("float32");
    set_fp8_recipe(Fp8Recipe::kDelayed);
  }
};

TEST_F(Fp8Conv2DTest, ValidStrideOneEqualsQuantizedFloat64Convolution) { check_conv({2, 5, 7, 3, 4, 3, 1, false}); }

TEST_F(Fp8Conv2DTest, SameStrideTwoEqualsQuantizedFloat64Convolution) { check_conv({3, 7, 6, 5, 2, 3, 2, true}); }

// Block recipe: channels 40 and 33 give a full and a short block along cin and cout, positions 2 x 7 x 6 = 84 three
// blocks down (N H W); the inputs span magnitudes (2^-5 .. 2^3) so that blocks get different scales.
TEST_F(Fp8Conv2DTest, BlockRecipeEqualsTheDequantizedFloat64Convolution) {
  check_conv({2, 7, 6, 40, 33, 3, 1, true}, Fp8Recipe::kBlock);
  check_conv({1, 5, 9, 3, 4, 3, 2, false}, Fp8Recipe::kBlock);
}

// What a recorded call keeps for backward, above what was live before it: the bfloat16 output and the saved
// operands, x and the kernel as codes (one byte an element); under the block recipe each with its blocks' E8M0 scale
// bytes (x down its N H W positions, the kernel along cout), where until 2026-12-07 it kept their bfloat16 values.
// The backward pass then gives the gradients the float64 reference checks (BlockRecipeEquals... above).
TEST_F(Fp8Conv2DTest, KeepsItsInputAndKernelAsCodesUnderEveryRecipe) {
  const int64_t n = 2, h = 9, w = 8, cin = 33, cout = 40, k = 3;
  const int64_t positions = n * (h - k + 1) * (w - k + 1), x_codes = n * h * w * cin, w_codes = k * k * cin * cout;
  const int64_t x_scales = (n * h * w + 31) / 32 * cin, w_scales = k * k * cin * ((cout + 31) / 32);
  for (Fp8Recipe recipe : {Fp8Recipe::kDelayed, Fp8Recipe::kCurrent, Fp8Recipe::kBlock}) {
    set_fp8_recipe(recipe);
    Conv2D conv(cout, k, 1, "valid", "linear", true, dtype_arg("mixed_float8"));
    Rng rng(3);
    conv.build({h, w, cin}, rng);
    Rng values(4);
    std::vector<float> xv(static_cast<size_t>(x_codes));
    for (float& v : xv) v = values.uniform(-2, 2);
    const Var x(Tensor::from_floats({n, h, w, cin}, xv, DType::kBFloat16), /*requires_grad=*/true);
    conv(x);  // the scales made, the GEMM's buffers warm
    const int64_t before = memory_stats().live_bytes;
    const Var y = conv(x);
    const int64_t held = memory_stats().live_bytes - before;
    const bool block = recipe == Fp8Recipe::kBlock;
    EXPECT_EQ(held, positions * cout * 2 + x_codes + w_codes + (block ? x_scales + w_scales : 0))
        << fp8_recipe_name(recipe);
  }
}

TEST_F(Fp8Conv2DTest, RollsItsHistoriesPerUpdateAndKeepsNoComputeCopy) {
  Conv2D conv(2, 3, 1, "valid", "relu", true, dtype_arg("mixed_float8"));
  Rng rng(9);
  conv.build({4, 4, 1}, rng);
  EXPECT_FALSE(conv.reads_compute_copies());
  Var x(Tensor::from_floats({1, 4, 4, 1}, std::vector<float>(16, 0.5f)));
  backward(sum(cast(conv(x), DType::kFloat32)));
  ASSERT_NE(conv.fp8_scales(), nullptr);
  EXPECT_EQ(conv.fp8_scales()->input.delayed().history().back(), 0.5f);
  conv.on_optimizer_update();
  EXPECT_EQ(conv.fp8_scales()->input.delayed().scale(), 448.0f / 0.5f);
}

}  // namespace
}  // namespace mixtrain
