// Initializers by Keras' names (distribution, scale and fans as Keras computes them) and L1/L2 regularizers
// (penalty against a float64 reference, gradient against finite differences, summed over a model).
#include <gtest/gtest.h>

#include <cmath>

#include "mixtrain/autograd/gradcheck.h"
#include "mixtrain/nn/conv_layers.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/sequential.h"

namespace mixtrain {
namespace {

struct Stats {
  double variance = 0, max_abs = 0;
};
Stats stats(const Tensor& t) {
  Stats s;
  double mean = 0;
  for (int64_t i = 0; i < t.numel(); ++i) mean += t.at(i);
  mean /= static_cast<double>(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) {
    s.variance += (t.at(i) - mean) * (t.at(i) - mean);
    s.max_abs = std::max(s.max_abs, std::fabs(static_cast<double>(t.at(i))));
  }
  s.variance /= static_cast<double>(t.numel());
  return s;
}

TEST(Initializers, KerasFormulasOnDenseAndConvShapes) {
  struct Case {
    const char* name;
    double scale;
    int fans;  // 0: (fan_in + fan_out) / 2, 1: fan_in
    bool uniform;
  };
  const Case cases[] = {{"glorot_uniform", 1, 0, true}, {"glorot_normal", 1, 0, false}, {"he_uniform", 2, 1, true},
                        {"he_normal", 2, 1, false},     {"lecun_uniform", 1, 1, true}, {"lecun_normal", 1, 1, false}};
  // 131,072 and 147,456 draws: the sample variance is within about 1.3% (3 standard errors) of the true one.
  const Shape dense{256, 512}, conv{3, 3, 64, 256};
  for (const Case& c : cases) {
    for (const Shape& shape : {dense, conv}) {
      const double receptive = shape.rank() == 4 ? 9.0 : 1.0;
      const double fan_in = static_cast<double>(shape[-2]) * receptive, fan_out = static_cast<double>(shape[-1]) * receptive;
      const double n = c.fans == 0 ? (fan_in + fan_out) / 2 : fan_in;
      const double variance = c.scale / n;  // Keras' VarianceScaling: the variance of every variant
      Rng rng(5);
      const Initializer init = initializer_from_name(c.name);
      EXPECT_EQ(initializer_name(init), c.name);
      const Stats s = stats(initial_value(shape, init, rng));
      EXPECT_NEAR(s.variance, variance, 0.02 * variance) << c.name << " " << shape;
      // Uniform: within the limit sqrt(3 variance); truncated normal: within two of its deviations.
      const double bound = c.uniform ? std::sqrt(3 * variance) : 2 * std::sqrt(variance) / 0.87962566103423978;
      EXPECT_LE(s.max_abs, bound * (1 + 1e-6)) << c.name;
      EXPECT_GT(s.max_abs, 0.95 * bound) << c.name;
    }
  }
  Rng rng(1);
  EXPECT_EQ(stats(initial_value({7}, initializer_from_name("ones"), rng)).max_abs, 1.0);
  EXPECT_EQ(stats(initial_value({7}, initializer_from_name("zeros"), rng)).max_abs, 0.0);
  try {
    initializer_from_name("xavier");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("glorot_uniform"), std::string::npos) << e.what();
  }
}

TEST(Initializers, DenseAndConvTakeThemByName) {
  Dense d(300);
  d.set_kernel_initializer("he_normal").set_bias_initializer("ones");
  Rng rng(2);
  d.build({400}, rng);
  EXPECT_NEAR(stats(d.kernel().value()).variance, 2.0 / 400, 0.05 * 2.0 / 400);
  EXPECT_EQ(d.bias().value().at(17), 1.0f);
  EXPECT_THROW(d.set_kernel_initializer("zeros"), Error);  // built already
  Conv2D c(8, 3);
  c.set_kernel_initializer("zeros");
  c.build({5, 5, 2}, rng);
  EXPECT_EQ(stats(c.kernel().value()).max_abs, 0.0);
  // The default Conv2D kernel is glorot_uniform over kh kw cin and kh kw filters.
  Conv2D g(16, 3);
  g.build({5, 5, 4}, rng);
  EXPECT_LE(stats(g.kernel().value()).max_abs, std::sqrt(6.0 / (9.0 * (4 + 16))));
}

TEST(Regularizers, PenaltyAndGradient) {
  const Tensor w = Tensor::from_floats({2, 3}, {0.5f, -1.5f, 2.0f, -0.25f, 0.75f, -3.0f});
  double l1 = 0, l2 = 0;
  for (int64_t i = 0; i < 6; ++i) {
    l1 += std::fabs(static_cast<double>(w.at(i)));
    l2 += static_cast<double>(w.at(i)) * w.at(i);
  }
  EXPECT_NEAR(regularization_penalty(Var(w), L1(0.1f)).value().at(0), 0.1 * l1, 1e-6);
  EXPECT_NEAR(regularization_penalty(Var(w), L2(0.01f)).value().at(0), 0.01 * l2, 1e-6);
  EXPECT_NEAR(regularization_penalty(Var(w), L1L2(0.1f, 0.01f)).value().at(0), 0.1 * l1 + 0.01 * l2, 1e-6);
  // No element sits at 0, where |w| has no derivative.
  const GradCheckResult r =
      check_gradients([](const std::vector<Var>& v) { return regularization_penalty(v[0], L1L2(0.1f, 0.01f)); }, {w});
  EXPECT_LT(r.max_rel_error, 5e-3) << r.worst;
  EXPECT_THROW(regularization_penalty(Var(w), L2(-1.0f)), Error);
}

TEST(Regularizers, ModelSumsItsLayersPenalties) {
  Sequential m;
  m.emplace<Dense>(4)->set_kernel_regularizer(L2(0.5f));
  m.emplace<Dense>(3);
  m.emplace<Dense>(2)->set_kernel_regularizer(L1(0.25f));
  Rng rng(3);
  m.build({5}, rng);
  double expected = 0;
  const Tensor k0 = m.layers()[0]->weights()[0].value(), k2 = m.layers()[2]->weights()[0].value();
  for (int64_t i = 0; i < k0.numel(); ++i) expected += 0.5 * k0.at(i) * k0.at(i);
  for (int64_t i = 0; i < k2.numel(); ++i) expected += 0.25 * std::fabs(k2.at(i));
  Var total = regularization_loss(m);
  EXPECT_NEAR(total.value().at(0), expected, 1e-5);
  backward(total);
  const Var& kernel0 = m.layers()[0]->weights()[0];
  ASSERT_TRUE(kernel0.has_grad());
  EXPECT_NEAR(kernel0.grad().at(3), 2 * 0.5 * k0.at(3), 1e-6);  // d(l2 w^2)/dw = 2 l2 w
  EXPECT_FALSE(m.layers()[1]->weights()[0].has_grad());         // not regularized
  Sequential plain;
  plain.emplace<Dense>(2);
  plain.build({2}, rng);
  EXPECT_EQ(regularization_loss(plain).value().at(0), 0.0f);
}

}  // namespace
}  // namespace mixtrain
