// Backward of every convolution, pooling and normalization function, checked against central finite
// differences in float32 (see gradcheck_test.cpp for the tolerance's reasoning). Each output is reduced
// to a scalar by a mean squared error against a fixed random target, so every element has its own weight.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "mixtrain/autograd/conv_functions.h"
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

// Distinct values 0.1 apart in random order: a perturbation of 1e-2 never changes which is a window's
// maximum, where max pooling's derivative exists.
Tensor spaced_tensor(const Shape& shape, uint64_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(shape.numel()));
  std::iota(order.begin(), order.end(), 0);
  Rng r(seed);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[static_cast<size_t>(r.below(i))]);
  std::vector<float> v(order.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * static_cast<float>(order[i]) - 0.05f * static_cast<float>(v.size());
  return Tensor::from_floats(shape, v);
}

constexpr double kGradTolerance = 5e-3;

void expect_gradients_match(const std::function<Var(const std::vector<Var>&)>& f, const std::vector<Tensor>& inputs,
                            const std::string& what) {
  const GradCheckResult r = check_gradients(f, inputs);
  EXPECT_LT(r.max_rel_error, kGradTolerance) << what << ": " << r.worst;
}

Var head(const Var& out) { return mean_squared_error(out, random_tensor(out.shape(), 99).to(out.dtype())); }

TEST(ConvGradCheck, Conv2dInputKernelAndBias) {
  struct Case {
    Shape x;
    Shape k;
    ops::Conv2dOptions o;
  };
  const Case cases[] = {
      {{2, 5, 4, 3}, {3, 3, 3, 2}, {1, ops::Padding::kValid}},
      {{2, 5, 4, 3}, {3, 3, 3, 2}, {1, ops::Padding::kSame}},
      {{1, 7, 6, 2}, {3, 2, 2, 3}, {{2, 1}, ops::Padding::kSame}},
      {{2, 6, 7, 2}, {2, 3, 2, 2}, {2, ops::Padding::kValid}},
      {{2, 3, 3, 4}, {1, 1, 4, 3}, {1, ops::Padding::kValid}},
  };
  for (const Case& c : cases) {
    const std::string what = "conv2d x " + c.x.to_string() + " kernel " + c.k.to_string() + " " +
                             ops::padding_name(c.o.padding);
    expect_gradients_match(
        [&](const std::vector<Var>& v) { return head(conv2d(v[0], v[1], v[1].value(), v[2], c.o)); },
        {random_tensor(c.x, 1), random_tensor(c.k, 2), random_tensor({c.k[3]}, 3)}, what);
  }
  // Without a bias.
  expect_gradients_match(
      [](const std::vector<Var>& v) { return head(conv2d(v[0], v[1], v[1].value(), Var(), {})); },
      {random_tensor({1, 4, 4, 2}, 4), random_tensor({2, 2, 2, 3}, 5)}, "conv2d without bias");
}

TEST(ConvGradCheck, MaxAndAveragePooling) {
  for (ops::Padding p : {ops::Padding::kValid, ops::Padding::kSame})
    for (const ops::Pool2dOptions& o : {ops::Pool2dOptions{2, 2, p}, ops::Pool2dOptions{3, {2, 1}, p}}) {
      const std::string what = std::string(ops::padding_name(p)) + " pool " + std::to_string(o.pool_size.h);
      expect_gradients_match([&](const std::vector<Var>& v) { return head(max_pool2d(v[0], o)); },
                             {spaced_tensor({2, 5, 6, 3}, 6)}, "max_pool2d " + what);
      expect_gradients_match([&](const std::vector<Var>& v) { return head(avg_pool2d(v[0], o)); },
                             {random_tensor({2, 5, 6, 3}, 7)}, "avg_pool2d " + what);
    }
  expect_gradients_match([](const std::vector<Var>& v) { return head(global_average_pool2d(v[0])); },
                         {random_tensor({2, 3, 5, 4}, 8)}, "global_average_pool2d");
}

TEST(ConvGradCheck, BatchNormTrainingAndInference) {
  const Tensor moving_mean = random_tensor({3}, 9, -0.5f, 0.5f), moving_var = random_tensor({3}, 10, 0.5f, 2.0f);
  for (bool training : {true, false})
    for (const Shape& s : {Shape{2, 3, 4, 3}, Shape{7, 3}}) {
      expect_gradients_match(
          [&](const std::vector<Var>& v) {
            return head(batch_norm(v[0], v[1], v[2], moving_mean, moving_var, 1e-3f, training).y);
          },
          {random_tensor(s, 11, -2.0f, 2.0f), random_tensor({3}, 12, 0.5f, 1.5f), random_tensor({3}, 13)},
          std::string("batch_norm ") + (training ? "training " : "inference ") + s.to_string());
    }
}

TEST(ConvGradCheck, Conv2dUnderMixedPrecisionSendsKernelGradientInFloat32) {
  // A bfloat16 activation and a float32 kernel variable read in bfloat16: x's gradient arrives in
  // bfloat16, the kernel's and the bias's in float32 (no 16-bit rounding on the way to the variable).
  Var x(random_tensor({2, 5, 5, 3}, 14).to(DType::kBFloat16), true);
  Var kernel(random_tensor({3, 3, 3, 4}, 15), true);
  Var bias(random_tensor({4}, 16), true);
  Var y = conv2d(x, kernel, kernel.value().to(DType::kBFloat16), bias, {1, ops::Padding::kSame});
  EXPECT_EQ(y.dtype(), DType::kBFloat16);
  backward(sum(y));
  EXPECT_EQ(x.grad().dtype(), DType::kBFloat16);
  EXPECT_EQ(kernel.grad().dtype(), DType::kFloat32);
  EXPECT_EQ(bias.grad().dtype(), DType::kFloat32);
}

TEST(ConvGradCheck, BatchNormReturnsBatchMomentsOnlyInTraining) {
  Var x(random_tensor({4, 3}, 17), true);
  Var gamma(Tensor::full({3}, DType::kFloat32, 1.0f), true), beta(Tensor::zeros({3}, DType::kFloat32), true);
  const Tensor mm = Tensor::zeros({3}, DType::kFloat32), mv = Tensor::full({3}, DType::kFloat32, 1.0f);
  BatchNormOutput t = batch_norm(x, gamma, beta, mm, mv, 1e-3f, true);
  EXPECT_TRUE(t.batch.mean.defined());
  EXPECT_TRUE(t.batch.variance.defined());
  BatchNormOutput i = batch_norm(x, gamma, beta, mm, mv, 1e-3f, false);
  EXPECT_FALSE(i.batch.mean.defined());
  clear_tape();
}

}  // namespace
}  // namespace mixtrain
