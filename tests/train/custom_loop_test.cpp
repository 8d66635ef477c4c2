// A custom training loop as a Keras user writes it: GradientTape, the optimizer's scale_loss and
// get_unscaled_gradients, on the train tests' blobs, in float32 and under both mixed policies.
#include <gtest/gtest.h>

#include <algorithm>

#include "blobs.h"
#include "mixtrain/autograd/gradient_tape.h"
#include "mixtrain/nn/layers.h"
#include "mixtrain/precision/loss_scale_optimizer.h"
#include "mixtrain/train/model.h"
#include "quiet_policy_test.h"

namespace mixtrain {
namespace {

double accuracy(Model& model, const Tensor& x, const Tensor& y) {
  const Tensor p = model.predict(x);  // (N, 3) float32
  const std::vector<int32_t> labels = y.to_ints();
  int64_t right = 0;
  for (int64_t i = 0; i < p.dim(0); ++i) {
    int64_t best = 0;
    for (int64_t c = 1; c < 3; ++c)
      if (p.at(i * 3 + c) > p.at(i * 3 + best)) best = c;
    right += best == labels[static_cast<size_t>(i)];
  }
  return static_cast<double>(right) / static_cast<double>(p.dim(0));
}

class CustomLoop : public QuietPolicyTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(CustomLoop, GradientTapeTrainsTheBlobs) {
  set_global_policy(GetParam());
  const bool scaled = global_policy().compute_dtype() == DType::kFloat16;
  auto [x, y] = train_test::blobs(600, 1);
  auto [tx, ty] = train_test::blobs(300, 2);
  Model model("mlp", 1);
  model.emplace<Dense>(16, "relu");
  model.emplace<Dense>(3);
  model.build_for({8});
  const std::vector<Var> vars = model.trainable_weights();
  std::unique_ptr<Optimizer> opt = make_optimizer("adam", 0.01f);
  if (scaled) opt = std::make_unique<LossScaleOptimizer>(std::move(opt));
  const int64_t batch = 32;
  for (int epoch = 0; epoch < 4; ++epoch) {
    for (int64_t s = 0; s < x.dim(0); s += batch) {
      const int64_t e = std::min(s + batch, x.dim(0));
      GradientTape tape;
      Var logits = model.call(Var(x.slice(0, s, e)), {.training = true, .rng = &model.dropout_rng()});
      Var loss = sparse_categorical_crossentropy(logits, y.slice(0, s, e), /*from_logits=*/true);
      const std::vector<Tensor> grads = tape.gradient(opt->scale_loss(loss), vars);
      if (scaled) {
        auto& lso = static_cast<LossScaleOptimizer&>(*opt);
        bool finite = false;
        const std::vector<Tensor> unscaled = lso.get_unscaled_gradients(grads, &finite);
        lso.apply_unscaled(unscaled, vars, finite);
      } else {
        opt->apply(grads, vars);
      }
      for (const Var& v : vars) ASSERT_FALSE(v.has_grad()) << v.name() << ": a stale gradient";
    }
  }
  EXPECT_GE(accuracy(model, tx, ty), 0.95) << GetParam();
  if (scaled) {
    EXPECT_EQ(static_cast<LossScaleOptimizer&>(*opt).skipped_steps(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, CustomLoop, ::testing::Values("float32", "mixed_float16", "mixed_bfloat16"));

// `model.call(x, {.training = true})`, as KERAS.md's loop writes it, draws Dropout's masks from the model's dropout
// stream: the one fit() draws from and a checkpoint saves, so a custom loop resumes as fit() does.
TEST(CustomLoop, ATrainingCallWithoutAGeneratorDrawsFromTheDropoutStream) {
  Model model("dropout_mlp", 4);
  model.emplace<Dense>(16, "relu");
  model.emplace<Dropout>(0.5f);
  model.emplace<Dense>(3);
  model.build_for({8});
  auto [x, y] = train_test::blobs(8, 1);
  Rng expected = model.dropout_rng();
  const Tensor implicit = model.call(Var(x), {.training = true}).value();
  EXPECT_NE(model.dropout_rng().state(), expected.state()) << "the masks came from elsewhere";
  // The same call given a copy of the stream as it was gives the same bits.
  const Tensor explicit_rng = model.call(Var(x), {.training = true, .rng = &expected}).value();
  EXPECT_EQ(implicit.to_floats(), explicit_rng.to_floats());
  EXPECT_EQ(model.dropout_rng().state(), expected.state());
}

TEST(CustomLoopErrors, AnOptimizerGivenNoVariablesSaysWhy) {
  // What a custom loop held when trainable_weights() answered an unbuilt model with an empty list (it now
  // throws; tests/train/unbuilt_model_test.cpp).
  const std::vector<Var> vars;
  for (bool wrap : {false, true}) {
    std::unique_ptr<Optimizer> opt = make_optimizer("sgd", 0.1f);
    if (wrap) opt = std::make_unique<LossScaleOptimizer>(std::move(opt));
    try {
      opt->apply({}, vars);
      FAIL() << "an update of no variables was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no variables"), std::string::npos) << e.what();
      EXPECT_NE(e.hint().find("build_for"), std::string::npos) << e.hint();
    }
  }
}

}  // namespace
}  // namespace mixtrain
