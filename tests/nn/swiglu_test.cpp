// SwiGLU against its definition in float64 from its own weights under every policy; its input and kernel gradients
// against finite differences; a regression it learns under mixed_bfloat16.
#include <gtest/gtest.h>

#include <cmath>

#include "mixtrain/autograd/functions.h"
#include "mixtrain/autograd/gradcheck.h"
#include "mixtrain/nn/swiglu.h"
#include "mixtrain/precision/policy.h"

namespace mixtrain {
namespace {

class SwiGLUTest : public ::testing::Test {
 protected:
  void TearDown() override { set_global_policy("float32"); }
};

Tensor random_tensor(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng r(seed);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = r.uniform(lo, hi);
  return Tensor::from_floats(shape, v);
}

// out[r, o] = sum_h silu(x W_gate)[r, h] (x W_up)[r, h] W_down[h, o] in float64, x (rows, d).
std::vector<double> reference(const std::vector<float>& x, const SwiGLU& l, int64_t rows, int64_t d) {
  const std::vector<float> wg = l.gate_kernel().value().to_floats(), wu = l.up_kernel().value().to_floats();
  const std::vector<float> wd = l.down_kernel().value().to_floats();
  const int64_t h = l.hidden_units(), o = l.output_units();
  std::vector<double> out(static_cast<size_t>(rows * o), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < h; ++k) {
      double g = 0, u = 0;
      for (int64_t j = 0; j < d; ++j) {
        g += static_cast<double>(x[static_cast<size_t>(r * d + j)]) * wg[static_cast<size_t>(j * h + k)];
        u += static_cast<double>(x[static_cast<size_t>(r * d + j)]) * wu[static_cast<size_t>(j * h + k)];
      }
      const double a = g / (1 + std::exp(-g)) * u;
      for (int64_t c = 0; c < o; ++c) out[static_cast<size_t>(r * o + c)] += a * wd[static_cast<size_t>(k * o + c)];
    }
  return out;
}

TEST_F(SwiGLUTest, MatchesItsDefinitionUnderEveryPolicy) {
  for (const char* policy : {"float32", "mixed_float16", "mixed_bfloat16"}) {
    set_global_policy(policy);
    const DType compute = global_policy().compute_dtype();
    SwiGLU l(12, 5);
    Tensor x = random_tensor({2, 3, 7}, 31, -2.0f, 2.0f).to(compute);
    Var y = l(Var(x));
    EXPECT_EQ(y.shape(), (Shape{2, 3, 5})) << policy;
    EXPECT_EQ(y.dtype(), compute) << policy;
    EXPECT_EQ(l.compute_output_shape({3, 7}), (Shape{3, 5}));
    EXPECT_EQ(l.weights().size(), 3u);
    for (const Var& w : l.weights()) EXPECT_EQ(w.dtype(), DType::kFloat32) << policy << " " << w.name();
    EXPECT_EQ(l.count_params(), 7 * 12 * 2 + 12 * 5);
    const std::vector<double> want = reference(x.to_floats(), l, 6, 7);
    const std::vector<float> got = y.value().to_floats();
    // Five roundings into the compute dtype along the way (two products, sigmoid, two multiplies, the output
    // product): each relative 2^-8 in bfloat16, 2^-11 in float16, carried through sums of 12 terms of size <= ~1.
    const double u = compute == DType::kBFloat16 ? 0x1p-8 : compute == DType::kFloat16 ? 0x1p-11 : 0x1p-24;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 40 * u * (1 + std::fabs(want[i]))) << policy;
  }
  EXPECT_THROW(SwiGLU(0, 4), Error);
  SwiGLU l(4, 3);
  l(Var(random_tensor({2, 5}, 1)));
  EXPECT_THROW(l(Var(random_tensor({2, 6}, 1))), Error);
}

// The layer's input gradient, and its kernels' gradients through a function that loads the kernels from the
// checked inputs, against central differences in float32 (tolerance as tests/autograd/gradcheck_test.cpp).
TEST_F(SwiGLUTest, GradientsMatchFiniteDifferences) {
  SwiGLU l(6, 3);
  Rng rng(3);
  l.build({4, 5}, rng);
  const Tensor target = random_tensor({2, 4, 3}, 99);
  const GradCheckResult rx = check_gradients(
      [&](const std::vector<Var>& v) { return mean_squared_error(l(v[0]), target); },
      {random_tensor({2, 4, 5}, 7, -2.0f, 2.0f)});
  EXPECT_LT(rx.max_rel_error, 5e-3) << rx.worst;
  const Tensor x = random_tensor({2, 4, 5}, 8, -2.0f, 2.0f);
  const auto composed = [&](const std::vector<Var>& v) {
    const Var x2 = reshape(Var(x), {8, 5});
    const Var g = matmul(x2, v[0]), u = matmul(x2, v[1]);
    const Var h = multiply(multiply(g, activation(g, ops::Activation::kSigmoid)), u);
    return mean_squared_error(reshape(matmul(h, v[2]), {2, 4, 3}), target);
  };
  const std::vector<Tensor> kernels = {l.gate_kernel().value(), l.up_kernel().value(), l.down_kernel().value()};
  const GradCheckResult rw = check_gradients(composed, kernels);
  EXPECT_LT(rw.max_rel_error, 5e-3) << rw.worst;
  // The layer's own kernel gradients equal the checked composition's (the same ops on the same float32 values, up
  // to the products' summation order: float32 rounding, 1e-6 relative).
  std::vector<Var> vars;
  for (const Tensor& k : kernels) vars.emplace_back(k, true);
  for (Var w : l.weights()) w.zero_grad();  // the input's check above left gradients in them
  backward(composed(vars));
  backward(mean_squared_error(l(Var(x)), target));
  for (size_t i = 0; i < vars.size(); ++i) {
    const Var& w = l.weights()[i];
    ASSERT_TRUE(w.has_grad()) << w.name();
    EXPECT_EQ(w.grad().dtype(), DType::kFloat32) << w.name();
    const std::vector<float> got = w.grad().to_floats(), want = vars[i].grad().to_floats();
    for (size_t j = 0; j < got.size(); ++j) EXPECT_NEAR(got[j], want[j], 1e-6 * (1 + std::fabs(want[j]))) << w.name();
  }
}

// A fixed random regression target: plain SGD on the float32 variables under mixed_bfloat16 lowers the loss.
TEST_F(SwiGLUTest, TrainsUnderMixedBFloat16) {
  set_global_policy("mixed_bfloat16");
  SwiGLU l(16, 2);
  const Tensor x = random_tensor({32, 6}, 41, -1.0f, 1.0f).to(DType::kBFloat16);
  const Tensor target = random_tensor({32, 2}, 42, -0.5f, 0.5f);
  std::vector<float> losses;
  for (int step = 0; step < 60; ++step) {
    clear_tape();
    Var loss = mean_squared_error(cast(l(Var(x)), DType::kFloat32), target);
    losses.push_back(loss.value().item());
    backward(loss);
    NoGradGuard no_grad;
    for (Var w : l.trainable_weights()) {
      ASSERT_EQ(w.grad().dtype(), DType::kFloat32) << w.name();
      const std::vector<float> g = w.grad().to_floats();
      std::vector<float> v = w.value().to_floats();
      for (size_t i = 0; i < v.size(); ++i) v[i] -= 0.5f * g[i];
      w.set_value(Tensor::from_floats(w.shape(), v));
      w.zero_grad();
    }
  }
  for (float v : losses) ASSERT_TRUE(std::isfinite(v));
  EXPECT_LT(losses.back(), 0.7f * losses.front()) << losses.front() << " -> " << losses.back();
}

}  // namespace
}  // namespace mixtrain
