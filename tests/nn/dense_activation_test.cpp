// A Dense layer with relu or gelu computes its activation inside the product (linear_activation); a small model of
// such layers trains to the same bytes as the same model with the activations as separate Activation layers,
// under every dtype policy. Dense(n, "softmax") (Keras' usual output layer) trains to the bytes of a linear Dense
// followed by a Softmax layer.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/autograd/functions.h"
#include "mixtrain/autograd/tape.h"
#include "mixtrain/nn/layers.h"

namespace mixtrain {
namespace {

class DenseActivationTest : public ::testing::TestWithParam<const char*> {
 protected:
  void TearDown() override { set_global_policy("float32"); }
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.contiguous().raw(), b.contiguous().raw(), a.nbytes()) == 0;
}

Tensor random_tensor(const Shape& shape, Rng& rng, float lo, float hi) {
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (float& x : v) x = rng.uniform(lo, hi);
  return Tensor::from_floats(shape, v);
}

// Three Dense layers (relu, gelu, linear) either with their activations or followed by Activation layers.
struct Mlp {
  std::vector<std::unique_ptr<Dense>> dense;
  std::vector<std::unique_ptr<Layer>> after;  // null where the Dense layer keeps its activation

  Mlp(bool separate, const std::vector<std::string>& activations, const std::vector<int64_t>& units) {
    for (size_t i = 0; i < units.size(); ++i) {
      dense.push_back(std::make_unique<Dense>(units[i], separate ? "linear" : activations[i]));
      after.push_back(!separate                       ? nullptr
                      : activations[i] == "softmax" ? std::unique_ptr<Layer>(std::make_unique<Softmax>())
                                                    : std::make_unique<Activation>(activations[i]));
    }
  }
  void build(int64_t in) {
    for (size_t i = 0; i < dense.size(); ++i) {
      Rng rng(100 + i);
      dense[i]->build({in}, rng);
      in = dense[i]->units();
      // Keras starts biases at zero; random ones let every pre-activation sign occur.
      Rng bias_rng(200 + i);
      Var b = dense[i]->bias();
      b.mutable_value() = random_tensor(b.shape(), bias_rng, -0.5f, 0.5f);
      b.bump_version();
    }
  }
  Var operator()(const Var& x) {
    Var h = x;
    for (size_t i = 0; i < dense.size(); ++i) {
      h = (*dense[i])(h);
      if (after[i]) h = (*after[i])(h);
    }
    return h;
  }
  // Plain SGD on the float32 variables.
  void step(float lr) {
    for (auto& d : dense) {
      for (Var v : {d->kernel(), d->bias()}) {
        const std::vector<float> g = v.grad().to_floats();
        float* w = v.mutable_value().data<float>();
        for (size_t i = 0; i < g.size(); ++i) w[i] -= lr * g[i];
        v.bump_version();
        v.zero_grad();
      }
    }
  }
};

void expect_same_training(const char* policy, const std::vector<std::string>& activations) {
  const std::vector<int64_t> units = {33, 17, 5};
  Mlp fused(false, activations, units), separate(true, activations, units);
  fused.build(13);
  separate.build(13);
  ASSERT_EQ(fused.dense[0]->compute_dtype(), separate.dense[0]->compute_dtype());
  Rng data(7);
  for (int step = 0; step < 4; ++step) {
    const Tensor x = random_tensor({41, 13}, data, -2.0f, 2.0f), target = random_tensor({41, 5}, data, -1.0f, 1.0f);
    Tensor outputs[2];
    int which = 0;
    for (Mlp* m : {&fused, &separate}) {
      clear_tape();
      Var y = (*m)(Var(x));
      backward(mean_squared_error(cast(y, DType::kFloat32), target));
      outputs[which++] = y.value();
      m->step(0.05f);
    }
    EXPECT_TRUE(same_bytes(outputs[0], outputs[1])) << policy << " step " << step;
    for (size_t i = 0; i < units.size(); ++i) {
      EXPECT_TRUE(same_bytes(fused.dense[i]->kernel().value(), separate.dense[i]->kernel().value()))
          << policy << " step " << step << " layer " << i;
      EXPECT_TRUE(same_bytes(fused.dense[i]->bias().value(), separate.dense[i]->bias().value()))
          << policy << " step " << step << " layer " << i;
    }
  }
  // The weights did move: a path that left them alone would pass the comparisons above.
  Mlp fresh(false, activations, units);
  fresh.build(13);
  EXPECT_FALSE(same_bytes(fresh.dense[0]->kernel().value(), fused.dense[0]->kernel().value()));
}

TEST_P(DenseActivationTest, TrainsToTheBytesOfSeparateActivationLayers) {
  set_global_policy(GetParam());
  expect_same_training(GetParam(), {"relu", "gelu", "linear"});
}

TEST_P(DenseActivationTest, SoftmaxTrainsToTheBytesOfASoftmaxLayer) {
  set_global_policy(GetParam());
  expect_same_training(GetParam(), {"relu", "tanh", "softmax"});
  // Every row of the output is a distribution.
  Dense out(5, "softmax");
  Rng rng(3);
  out.build({13}, rng);
  const std::vector<float> p = cast(out(Var(random_tensor({9, 13}, rng, -3.0f, 3.0f))), DType::kFloat32).value().to_floats();
  for (size_t row = 0; row < 9; ++row) {
    double sum = 0.0;
    for (size_t j = 0; j < 5; ++j) sum += p[row * 5 + j];
    // One rounding of each of 5 probabilities into the compute dtype: 5 half-ulps of 1 at most (bfloat16: 2^-8).
    EXPECT_NEAR(sum, 1.0, 5 * 0.5 * 0.0078125) << GetParam() << " row " << row;
  }
}

TEST(LayerActivation, UnknownNamesListSoftmaxAmongTheValidOnes) {
  try {
    Dense d(4, "softmx");
    FAIL() << "an unknown activation was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("softmx"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tanh, softmax"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Policy, DenseActivationTest,
                         ::testing::Values("float32", "mixed_float16", "mixed_bfloat16"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

}  // namespace
}  // namespace mixtrain
