// The comment examples of the public headers a Keras user reads first, compiled and run line for line:
// precision/loss_scale_optimizer.h, autograd/gradient_tape.h (one tape, nested tapes), train/weights_file.h,
// nn/layer.h (a custom layer reading its variables).
// An example that stops compiling fails the build here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "blobs.h"
#include "mixtrain/autograd/gradient_tape.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/optim/optimizer.h"
#include "mixtrain/precision/loss_scale_optimizer.h"
#include "mixtrain/train/model.h"
#include "mixtrain/train/weights_file.h"

namespace mixtrain {
namespace {

std::unique_ptr<Model> small_model() {
  auto m = std::make_unique<Model>("mlp", 3);
  m->emplace<Dense>(8, "relu");
  m->emplace<Dense>(3);
  m->build_for({8});
  return m;
}

TEST(HeaderExamples, LossScaleOptimizerCustomLoop) {
  auto [x, y] = train_test::blobs(32, 1);
  auto owner = small_model();
  Model& model = *owner;
  const std::vector<Var> vars = model.trainable_weights();
  const CallContext ctx{.training = true, .rng = &model.dropout_rng()};
  LossScaleOptimizer opt(make_optimizer("sgd", 0.1f));
  const Tensor before = vars[0].value().clone();
  // --- precision/loss_scale_optimizer.h, "A custom loop" ---
  GradientTape tape;
  Var loss = sparse_categorical_crossentropy(model.call(Var(x), ctx), y, /*from_logits=*/true);
  std::vector<Tensor> scaled_grads = tape.gradient(opt.scale_loss(loss), vars);  // gradients of loss * S
  opt.apply(scaled_grads, vars);  // unscales, checks, updates or skips, adjusts the scale
  // --- "Custom loops that clip or inspect unscaled gradients" ---
  bool finite;
  std::vector<Tensor> g = opt.get_unscaled_gradients(scaled_grads, &finite);
  const float unclipped = g[0].at(1);
  clip_by_global_norm(g, 1.0f);
  opt.apply_unscaled(g, vars, finite);
  // ---
  EXPECT_TRUE(finite);
  EXPECT_EQ(opt.skipped_steps(), 0);
  EXPECT_NE(vars[0].value().at(0), before.at(0));
  // The scaled gradients are S times the unscaled ones (S is a power of two: exact).
  EXPECT_EQ(scaled_grads[0].at(1) / opt.loss_scale(), unclipped);
}

TEST(HeaderExamples, GradientTape) {
  auto [x, y] = train_test::blobs(32, 2);
  auto owner = small_model();
  Model& model = *owner;
  Rng rng(1);
  auto optimizer_ptr = make_optimizer("adam", 0.01f);
  Optimizer& optimizer = *optimizer_ptr;
  // --- autograd/gradient_tape.h ---
  GradientTape tape;                                  // records the operations that follow
  Var logits = model.call(Var(x), {.training = true, .rng = &rng});
  Var loss = sparse_categorical_crossentropy(logits, y, /*from_logits=*/true);
  std::vector<Tensor> grads = tape.gradient(loss, model.trainable_weights());
  optimizer.apply(grads, model.trainable_weights());
  // ---
  EXPECT_EQ(optimizer.iterations(), 1);
}

TEST(HeaderExamples, NestedGradientTapes) {
  Var x(Tensor::from_floats({2, 3}, {0.5f, -1, 2, 1, 0.25f, -0.5f}));
  Var w1(Tensor::from_floats({3, 2}, {0.1f, -0.2f, 0.3f, 0.4f, -0.5f, 0.6f}), true, "w1");
  Var w2(Tensor::from_floats({2, 2}, {1, -1, 0.5f, 2}), true, "w2");
  // --- autograd/gradient_tape.h ---
  GradientTape outer;
  Var h = activation(matmul(x, w1), ops::Activation::kTanh);
  std::vector<Tensor> inner_grads;
  {
    GradientTape inner;
    Var y = sum(matmul(h, w2));
    inner_grads = inner.gradient(y, {w2, h});                    // d y / d w2 and d y / d h
  }
  Var loss = mean(matmul(h, w2));
  std::vector<Tensor> grads = outer.gradient(loss, {w1, w2});  // through h: all outer recorded
  // ---
  // d mean / d w2 = d sum / d w2 / 4 (four elements, sums exact in float32 at these magnitudes up to rounding).
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(grads[1].at(i), inner_grads[0].at(i) / 4, 1e-6f) << i;
  ASSERT_TRUE(grads[0].defined());
  GradientTape alone;
  Var h2 = activation(matmul(x, w1), ops::Activation::kTanh);
  const std::vector<Tensor> expected = alone.gradient(mean(matmul(h2, w2)), {w1});
  for (int i = 0; i < 6; ++i) EXPECT_EQ(grads[0].at(i), expected[0].at(i)) << i;
}

// nn/layer.h's custom layer, whose call() is the header's line.
class HeaderLinear : public Layer {
 public:
  HeaderLinear() : Layer("header_linear") {}
  Shape compute_output_shape(const Shape&) const override { return Shape{2}; }
  Var kernel_;

 protected:
  void build_impl(const Shape& in, Rng& rng) override {
    kernel_ = add_weight("kernel", {in[-1], 2}, Initializer::kGlorotUniform, rng);
  }
  // --- nn/layer.h ---
  Var call(const Var& x, const CallContext&) override { return matmul(x, kernel_); }
  // ---
};

TEST(HeaderExamples, CustomLayerReadsItsVariablesInTheComputeDtype) {
  set_global_policy("mixed_bfloat16");
  HeaderLinear layer;
  Var y = layer(Var(Tensor::full({4, 3}, DType::kFloat32, 1.0f)));
  set_global_policy("float32");
  EXPECT_EQ(y.dtype(), DType::kBFloat16);
  EXPECT_EQ(layer.kernel_.dtype(), DType::kFloat32);
  backward(sum(y));
  EXPECT_EQ(layer.kernel_.grad().dtype(), DType::kFloat32);
}

TEST(HeaderExamples, WeightsFile) {
  auto owner = small_model();
  Model& model = *owner;
  const std::string path = (std::filesystem::temp_directory_path() / "mixtrain_header_example.safetensors").string();
  // --- train/weights_file.h ---
  save_weights(model, path);
  Model fresh("mlp", 7);  // built the same way, any time, in any process
  fresh.emplace<Dense>(8, "relu");
  fresh.emplace<Dense>(3);
  load_weights(fresh, path);
  // ---
  EXPECT_EQ(fresh.weights()[0].value().at(5), model.weights()[0].value().at(5));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace mixtrain
