// Conv2D, pooling, BatchNormalization and Reshape layers: shapes, dtypes under every policy, Keras'
// training and inference behaviour of batch normalization, and a small CNN that learns under each policy.
#include <gtest/gtest.h>

#include <cmath>

#include "mixtrain/autograd/tape.h"
#include "mixtrain/nn/conv_layers.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/nn/normalization.h"
#include "mixtrain/nn/reshaping.h"
#include "mixtrain/precision/hardware_check.h"

namespace mixtrain {
namespace {

const char* kPolicies[] = {"float32", "mixed_float16", "mixed_bfloat16"};

// Silences the CPU precision warning and restores the float32 policy after each test.
class ConvLayerTest : public ::testing::Test {
 protected:
  void SetUp() override { set_precision_warning_sink([](const std::string&) {}); }
  void TearDown() override {
    set_global_policy("float32");
    set_precision_warning_sink(nullptr);
    clear_tape();
  }
};

Tensor random_tensor(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng r(seed);
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = r.uniform(lo, hi);
  return Tensor::from_floats(shape, v);
}

TEST_F(ConvLayerTest, Conv2DShapesAndKerasInitialization) {
  Conv2D valid(8, 3);
  EXPECT_EQ(valid.compute_output_shape(Shape{28, 28, 1}), (Shape{26, 26, 8}));
  Conv2D same(8, 3, 1, "same");
  EXPECT_EQ(same.compute_output_shape(Shape{28, 28, 1}), (Shape{28, 28, 8}));
  Conv2D strided(4, {3, 2}, {2, 1}, "same");
  EXPECT_EQ(strided.compute_output_shape(Shape{7, 5, 3}), (Shape{4, 5, 4}));
  EXPECT_THROW(valid.compute_output_shape(Shape{784}), Error);
  EXPECT_THROW(Conv2D(0, 3), Error);
  EXPECT_THROW(Conv2D(4, 3, 1, "full"), Error);

  Rng rng(1);
  Conv2D c(16, 3, 1, "same", "relu");
  c.build(Shape{10, 10, 4}, rng);
  EXPECT_EQ(c.kernel().shape(), (Shape{3, 3, 4, 16}));
  EXPECT_EQ(c.bias().shape(), (Shape{16}));
  EXPECT_EQ(c.count_params(), 3 * 3 * 4 * 16 + 16);
  // glorot_uniform with receptive-field fans: limit sqrt(6 / (9 * 4 + 9 * 16)).
  const float limit = std::sqrt(6.0f / (9 * 4 + 9 * 16));
  float largest = 0;
  for (float w : c.kernel().value().to_floats()) largest = std::max(largest, std::fabs(w));
  EXPECT_LE(largest, limit);
  EXPECT_GT(largest, 0.8f * limit);
  for (float b : c.bias().value().to_floats()) EXPECT_EQ(b, 0.0f);
}

TEST_F(ConvLayerTest, Conv2DDtypesUnderEveryPolicy) {
  for (const char* policy : kPolicies) {
    set_global_policy(policy);
    const DTypePolicy p = DTypePolicy::from_name(policy);
    Conv2D c(5, 3, 2, "same", "relu");
    Rng rng(2);
    Var x(random_tensor({2, 7, 9, 3}, 3));  // float32 input, autocast to the compute dtype
    Var y = c(x, CallContext{true, &rng});
    EXPECT_EQ(c.kernel().dtype(), p.variable_dtype()) << policy;
    EXPECT_EQ(y.dtype(), p.compute_dtype()) << policy;
    EXPECT_EQ(y.shape(), (Shape{2, 4, 5, 5})) << policy;
    backward(sum(cast(y, DType::kFloat32)));
    ASSERT_TRUE(c.kernel().has_grad()) << policy;
    EXPECT_EQ(c.kernel().grad().dtype(), DType::kFloat32) << policy;
    EXPECT_EQ(c.bias().grad().dtype(), DType::kFloat32) << policy;
  }
}

TEST_F(ConvLayerTest, PoolingLayersShapesAndDefaults) {
  MaxPooling2D mp;  // pool 2, strides = pool size
  EXPECT_EQ(mp.options().strides, ops::Size2(2));
  EXPECT_EQ(mp.compute_output_shape(Shape{28, 28, 32}), (Shape{14, 14, 32}));
  EXPECT_EQ(MaxPooling2D(3).compute_output_shape(Shape{7, 7, 2}), (Shape{2, 2, 2}));
  EXPECT_EQ(MaxPooling2D(3, ops::Size2(2), "same").compute_output_shape(Shape{7, 7, 2}), (Shape{4, 4, 2}));
  EXPECT_EQ(AveragePooling2D(2, ops::Size2(1)).compute_output_shape(Shape{5, 6, 3}), (Shape{4, 5, 3}));
  EXPECT_EQ(GlobalAveragePooling2D().compute_output_shape(Shape{5, 6, 3}), (Shape{3}));
  EXPECT_THROW(MaxPooling2D(2, std::nullopt, "other"), Error);

  for (const char* policy : kPolicies) {
    set_global_policy(policy);
    const DType compute = DTypePolicy::from_name(policy).compute_dtype();
    Var x(random_tensor({2, 6, 5, 3}, 4), true);
    MaxPooling2D m;
    AveragePooling2D a(3, ops::Size2(1), "same");
    GlobalAveragePooling2D g;
    Var ym = m(x), ya = a(x), yg = g(x);
    EXPECT_EQ(ym.shape(), (Shape{2, 3, 2, 3}));
    EXPECT_EQ(ya.shape(), (Shape{2, 6, 5, 3}));
    EXPECT_EQ(yg.shape(), (Shape{2, 3}));
    for (const Var* y : {&ym, &ya, &yg}) EXPECT_EQ(y->dtype(), compute) << policy;
    backward(add(add(sum(cast(ym, DType::kFloat32)), sum(cast(ya, DType::kFloat32))), sum(cast(yg, DType::kFloat32))));
    ASSERT_TRUE(x.has_grad());
    EXPECT_EQ(x.grad().dtype(), DType::kFloat32);  // the float32 input receives its gradient in float32
  }
}

TEST_F(ConvLayerTest, BatchNormalizationVariablesAreFloat32UnderMixedPolicies) {
  for (const char* policy : kPolicies) {
    set_global_policy(policy);
    const DType compute = DTypePolicy::from_name(policy).compute_dtype();
    BatchNormalization bn;
    Rng rng(5);
    Var x(random_tensor({4, 3, 3, 6}, 6, 1.0f, 3.0f));
    Var y = bn(x, CallContext{true, &rng});
    EXPECT_EQ(y.dtype(), compute) << policy;
    ASSERT_EQ(bn.weights().size(), 4u);
    for (const Var& w : bn.weights()) EXPECT_EQ(w.dtype(), DType::kFloat32) << policy << " " << w.name();
    ASSERT_EQ(bn.trainable_weights().size(), 2u);
    EXPECT_TRUE(bn.trainable_weights()[0].same(bn.gamma()));
    EXPECT_TRUE(bn.trainable_weights()[1].same(bn.beta()));
    EXPECT_FALSE(bn.moving_mean().trainable());
    EXPECT_FALSE(bn.moving_variance().requires_grad());
    backward(sum(cast(y, DType::kFloat32)));
    EXPECT_EQ(bn.gamma().grad().dtype(), DType::kFloat32);
    EXPECT_FALSE(bn.moving_mean().has_grad());
  }
}

TEST_F(ConvLayerTest, BatchNormalizationTrainingUsesBatchStatisticsAndUpdatesMovingOnesAsKeras) {
  BatchNormalization bn(/*momentum=*/0.9f);
  Rng rng(7);
  const Tensor xt = random_tensor({5, 2, 3, 4}, 8, 1.0f, 5.0f);
  Var y = bn(Var(xt), CallContext{true, &rng});
  // Each channel of the output has mean ~0 and (biased) variance ~1 - eps / (var + eps).
  const std::vector<float> xv = xt.to_floats(), yv = y.value().to_floats();
  const int64_t c = 4, rows = xt.numel() / c;
  for (int64_t j = 0; j < c; ++j) {
    double m = 0, v = 0, ym = 0, yv2 = 0;
    for (int64_t r = 0; r < rows; ++r) {
      m += xv[static_cast<size_t>(r * c + j)];
      ym += yv[static_cast<size_t>(r * c + j)];
    }
    m /= rows;
    ym /= rows;
    for (int64_t r = 0; r < rows; ++r) {
      v += std::pow(xv[static_cast<size_t>(r * c + j)] - m, 2);
      yv2 += std::pow(yv[static_cast<size_t>(r * c + j)] - ym, 2);
    }
    v /= rows;  // biased, as Keras' ops.moments
    yv2 /= rows;
    EXPECT_NEAR(ym, 0.0, 1e-5);
    EXPECT_NEAR(yv2, v / (v + 1e-3), 1e-4);
    // moving = moving * momentum + batch * (1 - momentum), from zeros and ones.
    EXPECT_NEAR(bn.moving_mean().value().at(j), 0.1 * m, 1e-5);
    EXPECT_NEAR(bn.moving_variance().value().at(j), 0.9 + 0.1 * v, 1e-5);
  }
  clear_tape();

  // Inference: the moving statistics normalize, and they do not change.
  const std::vector<float> mm = bn.moving_mean().value().to_floats(), mv = bn.moving_variance().value().to_floats();
  const uint64_t version = bn.moving_mean().version();
  Var yi = bn(Var(xt), CallContext{false, &rng});
  const std::vector<float> yiv = yi.value().to_floats();
  for (int64_t i = 0; i < xt.numel(); ++i) {
    const size_t j = static_cast<size_t>(i % c);
    EXPECT_NEAR(yiv[static_cast<size_t>(i)], (xv[static_cast<size_t>(i)] - mm[j]) / std::sqrt(mv[j] + 1e-3), 1e-5);
  }
  EXPECT_EQ(bn.moving_mean().version(), version);
  EXPECT_EQ(bn.moving_mean().value().to_floats(), mm);
}

// A batch that overflowed float16 (an infinity in one channel) leaves both moving statistics exactly as they
// were and is counted; the next finite batch updates them again.
TEST_F(ConvLayerTest, BatchNormalizationMovingStatisticsSkipNonFiniteBatches) {
  set_global_policy("mixed_float16");
  BatchNormalization bn(/*momentum=*/0.9f);
  Rng rng(11);
  const Tensor good = random_tensor({8, 3}, 12, -1.0f, 1.0f).to(DType::kFloat16);
  bn(Var(good), CallContext{true, &rng});
  clear_tape();
  const std::vector<float> mean = bn.moving_mean().value().to_floats();
  const std::vector<float> variance = bn.moving_variance().value().to_floats();
  const uint64_t version = bn.moving_mean().version();
  EXPECT_EQ(bn.skipped_moving_updates(), 0);

  std::vector<float> bad = good.to_floats();
  bad[4] = INFINITY;  // row 1, channel 1
  Var y = bn(Var(Tensor::from_floats({8, 3}, bad).to(DType::kFloat16)), CallContext{true, &rng});
  clear_tape();
  EXPECT_EQ(bn.skipped_moving_updates(), 1);
  EXPECT_EQ(bn.moving_mean().value().to_floats(), mean);
  EXPECT_EQ(bn.moving_variance().value().to_floats(), variance);
  EXPECT_EQ(bn.moving_mean().version(), version);
  // The batch itself still normalizes with its own (non-finite) statistics, as in Keras: the loss is not
  // finite, and the loss-scale optimizer skips the step.
  bool any_nonfinite = false;
  for (float v : y.value().to_floats()) any_nonfinite = any_nonfinite || !std::isfinite(v);
  EXPECT_TRUE(any_nonfinite);

  bn(Var(good), CallContext{true, &rng});
  clear_tape();
  EXPECT_EQ(bn.skipped_moving_updates(), 1);
  EXPECT_NE(bn.moving_mean().value().to_floats(), mean);
  for (float v : bn.moving_variance().value().to_floats()) EXPECT_TRUE(std::isfinite(v));
}

TEST_F(ConvLayerTest, BatchNormalizationIsFloat32MathOnFloat16Inputs) {
  // Values near 300 with a spread of ~0.1: float16 arithmetic (spacing 0.25 there) would lose the
  // deviations entirely; float32 statistics keep them, and only the output is rounded to float16.
  set_global_policy("mixed_float16");
  BatchNormalization bn;
  Rng rng(9);
  std::vector<float> v(64);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 300.0f + 0.25f * static_cast<float>(i % 2);  // exact in float16
  Var y = bn(Var(Tensor::from_floats({64, 1}, v)), CallContext{true, &rng});
  ASSERT_EQ(y.dtype(), DType::kFloat16);
  const std::vector<float> yv = y.value().to_floats();
  // Deviations of +-0.125 over a std of 0.125 normalize to about +-1 (eps 1e-3 shrinks them slightly).
  const double want = 0.125 / std::sqrt(0.125 * 0.125 + 1e-3);
  EXPECT_NEAR(yv[0], -want, 2e-3);
  EXPECT_NEAR(yv[1], want, 2e-3);
  EXPECT_NEAR(bn.moving_mean().value().at(0), 0.01 * 300.125, 1e-4);
}

TEST_F(ConvLayerTest, ReshapeResolvesMinusOneAndChecksCounts) {
  Reshape r({28, 28, -1});
  EXPECT_EQ(r.compute_output_shape(Shape{784}), (Shape{28, 28, 1}));
  EXPECT_EQ(Reshape({-1}).compute_output_shape(Shape{2, 3, 4}), (Shape{24}));
  EXPECT_THROW(Reshape({5, -1}).compute_output_shape(Shape{7}), Error);
  EXPECT_THROW(Reshape({3, 3}).compute_output_shape(Shape{10}), Error);
  EXPECT_THROW(Reshape({-1, -1}), Error);
  EXPECT_THROW(Reshape({0, 4}), Error);
  Var x(random_tensor({3, 12}, 10), true);
  Var y = Reshape({2, -1, 3})(x);
  EXPECT_EQ(y.shape(), (Shape{3, 2, 2, 3}));
  backward(sum(y));
  EXPECT_EQ(x.grad().shape(), (Shape{3, 12}));
}

// Reshape - Conv-BN-ReLU-Pool - Conv-BN-ReLU-Pool - Flatten - Dense on a fixed batch: plain SGD on the
// float32 variables must reduce the loss under every policy (gradients flow through every layer).
TEST_F(ConvLayerTest, SmallCnnLearnsUnderEveryPolicy) {
  const Tensor x = random_tensor({16, 64}, 11, 0.0f, 1.0f);
  std::vector<int32_t> labels(16);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int32_t>(i % 3);
  const Tensor y = Tensor::from_ints({16}, labels);
  for (const char* policy : kPolicies) {
    set_global_policy(policy);
    std::vector<std::unique_ptr<Layer>> layers;
    layers.push_back(std::make_unique<Reshape>(std::vector<int64_t>{8, 8, 1}));
    layers.push_back(std::make_unique<Conv2D>(4, 3, 1, "same"));
    layers.push_back(std::make_unique<BatchNormalization>());
    layers.push_back(std::make_unique<Activation>("relu"));
    layers.push_back(std::make_unique<MaxPooling2D>());
    layers.push_back(std::make_unique<Conv2D>(6, 3, 1, "same", "linear", false));
    layers.push_back(std::make_unique<BatchNormalization>());
    layers.push_back(std::make_unique<Activation>("relu"));
    layers.push_back(std::make_unique<AveragePooling2D>());
    layers.push_back(std::make_unique<Flatten>());
    layers.push_back(std::make_unique<Dense>(3, "linear", dtype_arg("float32")));
    Rng rng(12);
    auto step = [&](bool update) {
      Var h(x);
      for (auto& l : layers) h = (*l)(h, CallContext{true, &rng});
      Var loss = sparse_categorical_crossentropy(h, y, true);
      const float value = loss.value().item();
      if (!update) {
        clear_tape();
        return value;
      }
      backward(loss);
      NoGradGuard ng;
      for (auto& l : layers)
        for (Var w : l->trainable_weights()) {
          EXPECT_TRUE(w.has_grad()) << policy << " " << w.name();
          if (!w.has_grad()) continue;
          Tensor v = w.value().to(DType::kFloat32);
          const std::vector<float> g = w.grad().to_floats();
          float* p = v.data<float>();
          for (int64_t i = 0; i < v.numel(); ++i) p[i] -= 0.1f * g[static_cast<size_t>(i)];
          w.set_value(v);
          w.zero_grad();
        }
      return value;
    };
    const float first = step(true);
    for (int i = 0; i < 30; ++i) step(true);
    const float last = step(false);
    EXPECT_TRUE(std::isfinite(first) && std::isfinite(last)) << policy;
    EXPECT_LT(last, 0.7f * first) << policy << ": loss " << first << " -> " << last;
  }
}

}  // namespace
}  // namespace mixtrain
