// A custom layer in a stack needs no compute_output_shape(): build() measures what its call() gives, as Keras
// infers a layer's output shape by running it. And a stack from a list (Keras' Sequential([...])).
#include <gtest/gtest.h>

#include "mixtrain/autograd/gradient_tape.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/train/model.h"
#include "quiet_policy_test.h"

namespace mixtrain {
namespace {

using InferredOutputShape = QuietPolicyTest;

// A linear map to `units` features without a compute_output_shape() override.
struct Projection : Layer {
  explicit Projection(int64_t units) : Layer("projection"), units(units) {}
  void build_impl(const Shape& input_shape, Rng& rng) override {
    w = add_weight("w", {input_shape[-1], units}, Initializer::kGlorotUniform, rng);
  }
  Var call(const Var& x, const CallContext&) override { return matmul(x, w); }
  int64_t units;
  Var w;
};

// Keeps the shape: its default answer must stay the input shape.
struct Doubling : Layer {
  Doubling() : Layer("doubling") {}
  Var call(const Var& x, const CallContext&) override { return scale(x, 2.0f); }
};

TEST_F(InferredOutputShape, ACustomLayerWithoutAnOverrideFeedsTheNextLayerItsRealShape) {
  for (const char* policy : {"float32", "mixed_bfloat16", "mixed_float16"}) {
    set_global_policy(policy);
    Model model("m", 3);
    model.emplace<Projection>(5);
    model.emplace<Doubling>();
    model.emplace<Dense>(2, "linear", dtype_arg("float32"));
    model.build_for({7});
    EXPECT_EQ(model.layers()[0]->compute_output_shape({7}), Shape({5})) << policy;
    EXPECT_EQ(model.layers()[1]->compute_output_shape({5}), Shape({5})) << policy;
    EXPECT_EQ(model.output_shape(), Shape({2})) << policy;
    // The Dense after it was built for 5 features (it would have been 7 before the shape was measured).
    EXPECT_EQ(model.layers()[2]->weights().front().shape(), Shape({5, 2})) << policy;
    const Tensor y = model.predict(Tensor::zeros({4, 7}, DType::kFloat32));
    EXPECT_EQ(y.shape(), Shape({4, 2})) << policy;
  }
}

TEST_F(InferredOutputShape, ALayerBuiltOnFirstUseInsideATapeGetsItsExactGradient) {
  auto p = make_layer<Projection>(3);
  const std::vector<float> xs{1, 2, -1, 0.5f, 4, -3};  // (2, 3)
  GradientTape tape;  // the layer is built (and measured) on first use, inside the tape
  const Var loss = sum((*p)(Var(Tensor::from_floats({2, 3}, xs))));
  const std::vector<Tensor> grads = tape.gradient(loss, p->trainable_weights());
  ASSERT_EQ(grads.size(), 1u);
  // d sum(x w) / d w[i][j] = sum over rows of x[., i], for every j.
  const std::vector<float> g = grads[0].to_floats();
  ASSERT_EQ(g.size(), 9u);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_FLOAT_EQ(g[static_cast<size_t>(i * 3 + j)], xs[i] + xs[3 + i]);
  EXPECT_EQ(p->compute_output_shape({3}), Shape({3}));
}

TEST_F(InferredOutputShape, AStackFromAListEqualsTheSameStackLayerByLayer) {
  Model listed({make_layer<Dense>(8, "relu"), make_layer<Projection>(3)}, {5}, "listed", 11);
  Model added("added", 11);
  added.emplace<Dense>(8, "relu");
  added.emplace<Projection>(3);
  added.build_for({5});
  ASSERT_TRUE(listed.built());
  EXPECT_EQ(listed.output_shape(), Shape({3}));
  const Tensor x = Tensor::from_floats({2, 5}, {1, 2, 3, 4, 5, -1, -2, -3, -4, -5});
  EXPECT_EQ(listed.predict(x).to_floats(), added.predict(x).to_floats());
  // Without a shape it is built on first use, as a stack written layer by layer.
  Model lazy({make_layer<Dense>(4)});
  EXPECT_FALSE(lazy.built());
}

}  // namespace
}  // namespace mixtrain
