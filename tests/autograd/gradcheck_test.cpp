// Every differentiable function's backward, checked against central finite differences in float32.
// Each check reduces the output to a scalar with a mean squared error against a fixed random target,
// so every output element contributes with a different weight.
#include <gtest/gtest.h>

#include <cmath>

#include "mixtrain/autograd/functions.h"
#include "mixtrain/autograd/gradcheck.h"

namespace mixtrain {
namespace {

Tensor random_tensor(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng r(seed);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = r.uniform(lo, hi);
  return Tensor::from_floats(shape, v);
}

// Float32 central differences with eps 1e-2 on O(1) values: truncation error ~eps^2 |f'''| and rounding
// error ~2^-24 |f| / eps leave about 1e-3 relative agreement; 5e-3 leaves margin but catches a wrong
// formula (errors of a wrong gradient are O(1)).
constexpr double kGradTolerance = 5e-3;

void expect_gradients_match(const std::function<Var(const std::vector<Var>&)>& f, const std::vector<Tensor>& inputs,
                            const char* what) {
  const GradCheckResult r = check_gradients(f, inputs);
  EXPECT_LT(r.max_rel_error, kGradTolerance) << what << ": " << r.worst;
}

// Scalar head: mse against a fixed target of the output's shape.
Var head(const Var& out) { return mean_squared_error(out, random_tensor(out.shape(), 99).to(out.dtype())); }

TEST(GradCheck, MatmulAllTransposes) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const Shape sa = ta ? Shape{5, 3} : Shape{3, 5};
      const Shape sb = tb ? Shape{4, 5} : Shape{5, 4};
      expect_gradients_match([&](const std::vector<Var>& v) { return head(matmul(v[0], v[1], ta, tb)); },
                             {random_tensor(sa, 1), random_tensor(sb, 2)}, "matmul");
    }
}

TEST(GradCheck, LinearKernelInputAndBias) {
  expect_gradients_match(
      [](const std::vector<Var>& v) { return head(linear(v[0], v[1], v[1].value(), v[2])); },
      {random_tensor({6, 7}, 3), random_tensor({7, 5}, 4), random_tensor({5}, 5)}, "linear");
}

TEST(GradCheck, AddScaleBiasReshape) {
  expect_gradients_match([](const std::vector<Var>& v) { return head(add(v[0], scale(v[1], -2.5f))); },
                         {random_tensor({3, 4}, 6), random_tensor({3, 4}, 7)}, "add/scale");
  expect_gradients_match([](const std::vector<Var>& v) { return head(bias_add(v[0], v[1])); },
                         {random_tensor({3, 4}, 8), random_tensor({4}, 9)}, "bias_add");
  expect_gradients_match([](const std::vector<Var>& v) { return head(reshape(v[0], {2, 6})); },
                         {random_tensor({3, 4}, 10)}, "reshape");
}

TEST(GradCheck, MultiplyBothOperands) {
  expect_gradients_match([](const std::vector<Var>& v) { return head(multiply(v[0], v[1])); },
                         {random_tensor({3, 5}, 12, -2.0f, 2.0f), random_tensor({3, 5}, 13, -2.0f, 2.0f)}, "multiply");
  // The same Var on both sides (x * x): both gradients reach it.
  expect_gradients_match([](const std::vector<Var>& v) { return head(multiply(v[0], v[0])); },
                         {random_tensor({4, 3}, 14, -2.0f, 2.0f)}, "multiply(x, x)");
}

TEST(GradCheck, Activations) {
  for (auto a : {ops::Activation::kRelu, ops::Activation::kGelu, ops::Activation::kSigmoid, ops::Activation::kTanh}) {
    // Keep relu inputs away from the kink at 0, where the derivative does not exist.
    Tensor x = random_tensor({4, 6}, 11, -2.0f, 2.0f);
    if (a == ops::Activation::kRelu) {
      float* p = x.data<float>();
      for (int64_t i = 0; i < x.numel(); ++i)
        if (std::fabs(p[i]) < 0.05f) p[i] = 0.3f;
    }
    expect_gradients_match([a](const std::vector<Var>& v) { return head(activation(v[0], a)); }, {x},
                           ops::activation_name(a));
  }
}

TEST(GradCheck, SoftmaxAndLogSoftmax) {
  expect_gradients_match([](const std::vector<Var>& v) { return head(softmax(v[0])); },
                         {random_tensor({3, 7}, 12, -3, 3)}, "softmax");
  expect_gradients_match([](const std::vector<Var>& v) { return head(log_softmax(v[0])); },
                         {random_tensor({3, 7}, 13, -3, 3)}, "log_softmax");
}

TEST(GradCheck, Dropout) {
  // The same seed inside f draws the same mask at every evaluation.
  expect_gradients_match(
      [](const std::vector<Var>& v) {
        Rng r(5);
        return head(dropout(v[0], 0.3f, r));
      },
      {random_tensor({5, 8}, 14)}, "dropout");
}

TEST(GradCheck, LossesAndReductions) {
  const Tensor labels = Tensor::from_ints({4}, {0, 3, 2, 3});
  expect_gradients_match(
      [&](const std::vector<Var>& v) { return sparse_categorical_crossentropy(v[0], labels, true); },
      {random_tensor({4, 5}, 15, -2, 2)}, "sparse ce (logits)");
  expect_gradients_match(
      [&](const std::vector<Var>& v) { return sparse_categorical_crossentropy(v[0], labels, false); },
      {random_tensor({4, 5}, 16, 0.2f, 0.9f)}, "sparse ce (probabilities)");
  const Tensor soft = Tensor::from_floats({2, 3}, {0.2f, 0.5f, 0.3f, 0.0f, 1.0f, 0.0f});
  expect_gradients_match([&](const std::vector<Var>& v) { return categorical_crossentropy(v[0], soft, true); },
                         {random_tensor({2, 3}, 17, -2, 2)}, "categorical ce");
  expect_gradients_match([&](const std::vector<Var>& v) { return sum(v[0]); }, {random_tensor({3, 3}, 18)}, "sum");
  expect_gradients_match([&](const std::vector<Var>& v) { return mean(v[0]); }, {random_tensor({3, 3}, 19)}, "mean");
  expect_gradients_match([&](const std::vector<Var>& v) { return head(v[0]); }, {random_tensor({3, 3}, 20)}, "mse");
}

TEST(GradCheck, CastRoundTripCarriesGradientInFloat32) {
  // d/dx of a float32 -> bfloat16 -> float32 chain is 1 up to bfloat16 rounding of the output.
  Var x(random_tensor({2, 3}, 21), true);
  Var y = cast(cast(x, DType::kBFloat16), DType::kFloat32);
  backward(sum(y));
  ASSERT_TRUE(x.has_grad());
  EXPECT_EQ(x.grad().dtype(), DType::kFloat32);
  for (float g : x.grad().to_floats()) EXPECT_EQ(g, 1.0f);
}

TEST(Tape, NoGradRecordsNothingAndBackwardClears) {
  Var x(random_tensor({2, 2}, 22), true);
  {
    NoGradGuard ng;
    Var y = sum(activation(x, ops::Activation::kTanh));
    EXPECT_EQ(tape_size(), 0u);
    EXPECT_FALSE(y.requires_grad());
  }
  Var y = sum(activation(x, ops::Activation::kTanh));
  EXPECT_EQ(tape_size(), 2u);
  backward(y);
  EXPECT_EQ(tape_size(), 0u);
}

TEST(Tape, GradientsAccumulateWhenAVarIsUsedTwice) {
  Var x(Tensor::from_floats({1}, {3.0f}), true);
  backward(sum(add(x, x)));  // d(2x)/dx = 2
  EXPECT_EQ(x.grad().item(), 2.0f);
  backward(sum(scale(x, 4.0f)), 0.5f);  // accumulates 4 * 0.5 on top
  EXPECT_EQ(x.grad().item(), 4.0f);
}

}  // namespace
}  // namespace mixtrain
